"""The offset between this process's wall and monotonic clocks, read tightly (records carry one monotonic time and
get their wall time from the offset), and the test hook that skews it."""

from __future__ import annotations

import os
import time

_monotonic_ns = time.monotonic_ns

CLOCK_SKEW_ENV = "TELEMETRAIN_TEST_CLOCK_SKEW_NS"


def _test_clock_skew_ns() -> int:
    """A test hook: ``$TELEMETRAIN_TEST_CLOCK_SKEW_NS`` ns added to this process's wall clock reading (records and
    ``Telemetry.now``), as a host whose clock is off would be. The multi-rank tests give one rank a skewed clock and
    check that ``telemetrain trace`` realigns it (docs/distributed.md, "One timeline"). Read at every clock refresh;
    a value that is not an integer is ignored."""
    raw = os.environ.get(CLOCK_SKEW_ENV)
    if not raw:
        return 0
    try:
        return int(raw)
    except ValueError:
        return 0


def _read_offset() -> int:
    """Wall ns minus monotonic ns, from the tightest of up to 5 bracketed reads (plus the test hook's skew)."""
    skew = _test_clock_skew_ns()
    best_gap, best = 1 << 62, 0
    for _ in range(5):
        before = _monotonic_ns()
        wall = time.time_ns()
        after = _monotonic_ns()
        if after - before < best_gap:
            best_gap, best = after - before, wall - (before + after) // 2 + skew
        if best_gap < 50_000:
            break
    return best
