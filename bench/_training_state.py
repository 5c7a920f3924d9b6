"""bench_training.py's shared state and constants: the parsed arguments (``ARGS``, set by ``main``; read it as
``state.ARGS`` at call time, as ``main`` rebinds it), the extra results for the JSON (``EXTRA``), the run's fixed
sizes and the entry script that child processes re-run (``SCRIPT``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

ARGS: argparse.Namespace
EXTRA: dict[str, Any] = {}
DISTS = (
    "telemetrain",
    "nv-one-logger-core",
    "nv-one-logger-training-telemetry",
    "PyYAML",
    "opentelemetry-api",
    "opentelemetry-sdk",
    "torch",
)

GLOBAL_BATCH = 8
LOG_EVERY = 50
FLOPS_PER_SAMPLE = 6.0e9  # "given": any positive number (a 1B-parameter model's 6 x params per token, say)
ONE_LOGGER_LATE = 10_000  # one-logger's second block: iterations 10k-11k
FIRST_BLOCK = 1000  # iterations 0-1k
SCRIPT = Path(__file__).resolve().with_name("bench_training.py")  # what child processes re-run: the entry script

ONE_LOGGER_MODULE = "nv_one_logger.training_telemetry.api.training_telemetry_provider"
