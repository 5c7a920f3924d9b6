"""bench_core.py's shared state and constants: the parsed arguments (``ARGS``, set by ``main``; read it as
``state.ARGS`` at call time, as ``main`` rebinds it), the writer measurements for the JSON (``EXTRA``) and the
sizes of the runs."""

from __future__ import annotations

import argparse
from typing import Any

ARGS: argparse.Namespace
EXTRA: dict[str, dict[str, Any]] = {}  # throughput / flood measurements
SHORT_N = 10_000  # ops per repeat of the "short queue" rows
DISTS = ("torch", "prometheus-client", "opentelemetry-sdk", "telemetrain", "psutil")  # versions reported
