"""bench_stats.py's shared state and constants: the parsed arguments (``ARGS``, set by ``main``; read it as
``state.ARGS`` at call time, as ``main`` rebinds it), the extra results for the JSON (``EXTRA``), the windows the
stats reported (checked against the run store) and the summaries' field lists."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

if TYPE_CHECKING:
    from telemetrain.stats import Stat as AnyStat


ARGS: argparse.Namespace
EXTRA: dict[str, Any] = {"threads": [], "memory": [], "window_close": []}
EMITTED: Counter[str] = Counter()  # windows reported per stat name (listener), checked against the run store
EMITTED_SAMPLES: Counter[str] = Counter()
DISTS = ("torch", "telemetrain")  # versions reported

KIB = 1024
MEAN_COUNT = ["mean", "count"]
QUANTILES = ["count", "mean", "p50", "p90", "p99"]
QUANTILES_HIST = [*QUANTILES, "histogram"]

P = ParamSpec("P")
S = TypeVar("S")
StatT = TypeVar("StatT", bound="AnyStat")
