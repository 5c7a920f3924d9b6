"""Every threshold of the findings engine, in one place, with what it guards against.

Each rule needs an effect large enough to matter *and* a test saying it is not chance; both were calibrated on
repeated clean runs of small real jobs on a shared 2-core VM, loaded (load average 11-18) and quiet (1-6, ~3 ms
steps) (``bench/bench_findings.py --calibrate``; the measured noise and the margins are in docs/report.md,
"Findings: calibration"). Change them through
``Thresholds(...)`` (``analyse(data, Thresholds(slowdown_effect=1.5))``), not here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

__all__ = ["DEFAULT_THRESHOLDS", "Thresholds"]


@dataclass(frozen=True)
class Thresholds:
    # -- "got slower at step N": change points in the job's window medians -------------------------------------------
    slowdown_effect: float = 1.3  # episode median / reference, at least: net of the CPU wait, and the raw time too
    slowdown_alpha: float = 1e-3  # p of the shift of medians, at most
    slowdown_min_windows: int = 3  # windows on each side of a change (patience)
    slowdown_noise_z: float = 2.0  # and at least exp(this x the run's window-to-window noise of the log series)
    slowdown_min_added_s: float = 0.002  # and at least this much more per iteration (a scheduler time slice)
    # and lasting at least this many seconds of wall time: on a shared machine another tenant's burst slows every
    # step for a second or so, which no statistic on the guest's own series can tell from a change of the job (a
    # clean run on CI, 2026-11-27: 1.37x over 110 steps of ~8 ms, under a second)
    slowdown_min_seconds: float = 2.0
    changepoint_penalty: float = 3.0  # PELT's penalty per change, in noise variances x log(windows): where to cut
    # -- stragglers: a rank against the other ranks in the same window --------------------------------------------
    straggler_z: float = 4.0  # robust z against the other ranks' median and MAD, at least
    straggler_ratio: float = 1.25  # value / the other ranks' median, at least
    straggler_min_share: float = 0.05  # excess over the others, as a share of the window's iteration time
    # and at least this many seconds per iteration: microsecond steps (a loop of empty iterations) differ by a
    # microsecond between processes and cores, 1.7x, window after window -- no rank waits for that
    straggler_min_added_s: float = 1e-4
    straggler_scale_floor: float = 0.05  # the MAD scale is at least this share of the reference (identical ranks)
    straggler_patience: int = 3  # flagged windows in an episode, at least
    straggler_gap: int = 1  # unflagged windows an episode may skip
    straggler_alpha: float = 0.01  # binomial p of "this rank is the slowest this often", at most
    # -- time explained by a busy machine -------------------------------------------------------------------------
    contention_share: float = 0.5  # extra CPU wait covering this share of an excess ...
    contention_work_share: float = 0.25  # ... with extra CPU time under this share of it: the machine, not the job
    # a busier machine also computes slower (caches, memory bandwidth, steal): a slowdown must be (1 + this x the
    # rise of the contention, the share of runnable time waiting for a CPU) times larger (0.5: 1.625x for a rise of
    # 50 points); a contention that stays high (ranks sharing cores) raises the noise floor instead
    contention_inflation: float = 0.5
    # -- slow single iterations -----------------------------------------------------------------------------------
    slow_iteration_factor: float = 10.0  # a window's slowest iteration / the rank's median p50, at least
    slow_iteration_min_s: float = 1.0  # and at least this many seconds more
    # -- slow checkpoint ranks: a rank's save against the other ranks' saves of the same checkpoint --------------------
    checkpoint_ratio: float = 2.0  # its save / the other ranks' median, at least
    checkpoint_min_s: float = 1.0  # and at least this many seconds more (what each other rank waited)
    checkpoint_z: float = 4.0  # robust z against the other ranks' median and MAD, at least
    checkpoint_scale_floor: float = 0.1  # the MAD scale is at least this share of their median (identical saves)
    checkpoint_share: float = 0.5  # flagged at this share of the checkpoints it saved with others, at least
    # the lowest rank whose other ranks' saves are under this share of its own wrote the checkpoint for all
    checkpoint_writer_share: float = 0.05
    # -- memory growth ----------------------------------------------------------------------------------------------
    memory_alpha: float = 1e-3  # Mann-Kendall p of the upward trend, at most
    memory_tail_alpha: float = 0.01  # ... and of the trend over the last half (still growing, not a plateau)
    memory_min_growth_bytes: float = 64 * 2**20  # growth over the steady part of the run, at least
    memory_min_growth_fraction: float = 0.10  # and at least this share of where it started
    memory_min_samples: int = 8
    # -- loss and gradient-norm spikes -------------------------------------------------------------------------------
    spike_z: float = 15.0  # robust z against the previous points' median and MAD, at least
    spike_ratio: float = 3.0  # value / that median, at least
    spike_history: int = 20  # points in the running reference
    spike_min_history: int = 20  # points before the first test
    # several ranks' series of one name: a spike on few ranks is kept past the union bound over the ranks, or when
    # that many ranks spiking at one step by chance has p below this (values.py)
    spike_alpha: float = 0.01

    def __post_init__(self) -> None:
        for f in fields(self):  # every one a finite number >= 0; the checks below narrow some
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0:
                raise ValueError(f"{f.name} must be a finite number >= 0, got {value!r}")
        for name in ("slowdown_effect", "straggler_ratio", "checkpoint_ratio", "slow_iteration_factor", "spike_ratio"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 1:
                raise ValueError(f"{name} must be a ratio > 1, got {value!r}")
        for name in ("slowdown_alpha", "straggler_alpha", "memory_alpha", "memory_tail_alpha", "spike_alpha"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < 1:
                raise ValueError(f"{name} must be a probability in (0, 1), got {value!r}")
        for name in ("slowdown_min_windows", "straggler_patience", "memory_min_samples", "spike_history",
                     "spike_min_history"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if isinstance(self.changepoint_penalty, bool) or not isinstance(self.changepoint_penalty, (int, float)) \
                or not self.changepoint_penalty > 0:
            raise ValueError(f"changepoint_penalty must be > 0, got {self.changepoint_penalty!r}")
        for name in ("slowdown_noise_z", "slowdown_min_added_s", "slowdown_min_seconds", "straggler_min_added_s",
                     "checkpoint_min_s",
                     "checkpoint_z", "checkpoint_scale_floor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        for name in ("checkpoint_share", "checkpoint_writer_share"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise ValueError(f"{name} must be a share in [0, 1], got {value!r}")
        if type(self.straggler_gap) is not int or self.straggler_gap < 0:
            raise ValueError(f"straggler_gap must be an int >= 0, got {self.straggler_gap!r}")


DEFAULT_THRESHOLDS = Thresholds()
