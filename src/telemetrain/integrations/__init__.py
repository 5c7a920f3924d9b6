"""Bridges from training frameworks and torch's own telemetry modules into telemetrain."""
