"""The ``telemetrain launch`` command."""

from __future__ import annotations

from typing import Any

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add this module's subcommands to the ``telemetrain`` parser (``sub`` is its subparsers action)."""
    del sub
