"""What the report computes from a run and its session: plain data, no HTML (``html.py`` lays it out).

One pass over each process's records (``model_pass.py``) collects what every section needs, and feeds the findings
engine (``analysis.findings``: slowdowns, stragglers, slow checkpoint ranks, memory growth, spikes, crashes) the series
it reads (the checkpoint saves: from the lifecycle spans, ``findings.py``); the findings, the run-store health
findings (dropped records, damaged lines, ...) among them, are made by ``findings.py``. What the charts draw of the
windows (each rank's windows merged, the heatmap, the time by phase) is computed from the per-rank windows afterwards
(``windows.py``).
With the ``columnar`` extra the same collection is done by SQL (``model_sql.py``); both give the same model.
docs/report.md defines each number.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..analysis.findings import Finding, Note, Thresholds
from ..analysis.findings.builder import CRASH_SPANS
from ..show_list import still_running
from ..store.reader import ProcessLog, Run
from .curves import Curve
from .findings import model_torn_corrupt, report_findings
from .gpu_health import build_gpu_health
from .headline import headline
from .model_pass import (
    CHECKPOINT_SPANS,
    MAX_CHECKPOINT_ROWS,
    MAX_CHECKPOINT_SPANS,
    PHASES,
    SYSTEM_CHARTS,
    EventRow,
    SpanRow,
    Window,
    _Collector,
)
from .windows import Heatmap, WindowFigures

__all__ = ["PHASES", "Finding", "Note", "ReportModel", "Window", "build_model", "model_torn_corrupt"]


@dataclasses.dataclass
class Series:
    label: str
    points: list[tuple[float, float]]  # (seconds since the run's start, value)


@dataclasses.dataclass
class ReportModel:
    path: Path
    meta: dict[str, Any]
    run_id: str
    session_tag: str
    perf_tag: str
    start_ns: int
    end_ns: int
    processes: list[ProcessLog]
    agents: list[ProcessLog]
    headline: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)  # (label, value, how)
    # rank -> its windows in iteration order, merged to at most windows.MAX_WINDOWS_PER_RANK (see windows.py)
    windows: dict[int, Sequence[Window]] = dataclasses.field(default_factory=dict)
    window_counts: dict[int, int] = dataclasses.field(default_factory=dict)  # rank -> windows before merging
    heatmap: Heatmap | None = None
    # the lowest rank with exported iteration spans -> (t, seconds) of them, every k-th (k = max(1, n // 1000)): what
    # the iteration chart draws when there are no windows (one rank, not each: 1,000 points a rank at 1,024 ranks
    # would be held for nothing)
    iteration_spans: dict[int, list[tuple[float, float]]] = dataclasses.field(default_factory=dict)
    phase_seconds: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)  # rank -> phase -> s
    phase_source: dict[int, str] = dataclasses.field(default_factory=dict)  # rank -> "device" or "host"
    lifecycle: list[SpanRow] = dataclasses.field(default_factory=list)
    checkpoints: list[SpanRow] = dataclasses.field(default_factory=list)
    checkpoint_successes: list[EventRow] = dataclasses.field(default_factory=list)  # the earliest 500
    events: list[EventRow] = dataclasses.field(default_factory=list)
    events_left_out: int = 0
    event_counts: Counter[tuple[str, str, str]] = dataclasses.field(default_factory=Counter)
    problems: list[EventRow] = dataclasses.field(default_factory=list)  # warning+ events, failed spans, diagnostics
    stragglers: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    slow_ranks: list[tuple[int, float]] = dataclasses.field(default_factory=list)  # stragglers: (rank, x the others)
    slow_windows: list[Window] = dataclasses.field(default_factory=list)
    system: list[tuple[str, str, list[Series]]] = dataclasses.field(default_factory=list)  # (title, unit, series)
    metric_stats: dict[tuple[str, str], list[Any]] = dataclasses.field(default_factory=dict)
    span_stats: dict[tuple[str, str], list[Any]] = dataclasses.field(default_factory=dict)
    findings: list[Finding] = dataclasses.field(default_factory=list)
    notes: list[Note] = dataclasses.field(default_factory=list)  # the engine's context: a busy machine, ...
    goodput: Any = None  # training.goodput.GoodputReport of the session, when it could be computed
    gpu: Any = None  # gpu_health.GpuHealth: GPU samples joined to the windows, and energy per unit of work
    goodput_error: str = ""
    # the hyperparameters events (hparams.log_hyperparams: Lightning's, HF's, yours) and the training config event
    hyperparameters: dict[str, Any] = dataclasses.field(default_factory=dict)
    training_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    curves: list[Curve] = dataclasses.field(default_factory=list)  # the user's metrics as charts (curves.py)
    running: bool = False  # its training loop has not ended and it is still writing: an open loop is no crash

    @property
    def ranks(self) -> list[int]:
        return sorted({p.rank for p in self.processes})

    def seconds(self, wall_ns: int) -> float:
        """``wall_ns`` as seconds since the run's start (the x axis of the time charts)."""
        return (wall_ns - self.start_ns) / 1e9


def _goodput(run: Run, rank: int, engine: Any = None) -> tuple[Any, str]:
    from ..training.goodput import goodput

    error = ""
    for session_dir in (run.path.parent, run.path):  # a run folder alone is a session of one run
        try:
            # this run is read (or opened by SQL) already
            return goodput(session_dir, rank=rank, opened=(run,), engine=engine), ""
        except (ValueError, OSError) as exc:
            error = str(exc)
        except Exception as exc:  # noqa: BLE001 - odd records must not take the whole report down
            return None, f"goodput not computed: {type(exc).__name__}: {exc}"
    return None, error


def _natural(label: str) -> tuple[Any, ...]:
    """A sort key that puts ``rank 2`` before ``rank 10`` (and ``node9`` before ``node10``)."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", label))


def _system(model: ReportModel, c: _Collector) -> list[tuple[str, str, list[Series]]]:
    charts = []
    points_by = sorted(c.system_points().items(), key=lambda kv: (kv[0][0], _natural(kv[0][1])))
    for name, title, unit in SYSTEM_CHARTS:
        series = [Series(who, [(model.seconds(w), v) for w, v in points])
                  for (metric, who), points in points_by if metric == name]
        if series:
            charts.append((title, unit, series))
    return charts


def build_model(run: Run, thresholds: Thresholds | None = None, engine: Any = None) -> ReportModel:
    """Everything the report shows about ``run`` (and about its session: goodput, restarts); ``thresholds``: the
    findings engine's (default: ``analysis.findings.DEFAULT_THRESHOLDS``). ``engine``: a ``store.engine.Engine`` over
    the run, to collect by SQL (``model_sql``); without it the records are read here."""
    c: Any
    if engine is not None:
        from .model_sql import SqlCollector

        c = SqlCollector(run, engine, thresholds)
    else:
        c = _Collector(run)
    # goodput first: its queries read one rank's lifecycle at a time (DuckDB's working memory grows with a rank's
    # length), and run here before the collection holds the report's figures in Python (docs/scale.md)
    ranks = run.ranks
    goodput = _goodput(run, ranks[0] if ranks else 0, engine) if run.processes else (None, "")
    c.collect()
    start = c.first_ns if c.first_ns is not None else int(run.meta.get("created_wall_ns") or 0)
    end = c.last_ns if c.last_ns is not None else start
    model = ReportModel(path=run.path, meta=run.meta, run_id=run.run_id, session_tag=run.session_tag,
                        perf_tag=run.perf_tag, start_ns=start, end_ns=end, processes=run.processes,
                        agents=run.agents)
    figures: WindowFigures = c.window_figures()
    model.windows = {rank: ws for rank, ws in sorted(figures.merged.items()) if ws}
    model.window_counts = {rank: n for rank, n in sorted(figures.counts.items()) if n}
    model.heatmap = figures.heatmap
    spans = c.iteration_span_points()
    for rank in sorted(spans):
        points = spans.pop(rank)  # the collector's copy let go rank by rank as the model's is made
        if points:
            model.iteration_spans[rank] = [(model.seconds(w), d) for w, d in points]
    for rank in sorted(set(figures.phase_seconds) | set(c.span_phase_seconds)):
        if rank in figures.phase_seconds:
            seconds, total = figures.phase_seconds[rank]
            seconds = dict(seconds)
            # the window's phase averages cover all its iterations, its iteration times leave the warm-up out: the
            # warm-up iterations are taken at the window's mean
            model.phase_source[rank] = figures.phase_sources.get(rank, "host")
            other = total - math.fsum(seconds.values())
            seconds["other"] = other if other > 1e-9 * max(total, 1.0) else 0.0  # float dust is not a phase
        elif c.span_phase_seconds.get(rank):
            seconds = dict(c.span_phase_seconds[rank])  # exported spans only: a sample of the iterations
        else:
            continue
        model.phase_seconds[rank] = seconds
    model.lifecycle = sorted(c.lifecycle, key=lambda s: (s.start_ns, s.rank))
    model.checkpoints = [s for s in model.lifecycle if s.name in CHECKPOINT_SPANS]
    for span in model.checkpoints[MAX_CHECKPOINT_SPANS:]:  # (the SQL path does not read them)
        span.attributes = {}
    model.checkpoint_successes = sorted(c.successes, key=lambda e: e.wall_ns)[:MAX_CHECKPOINT_ROWS]
    model.events, model.events_left_out, model.event_counts = c.events, c.events_left_out, c.event_counts
    model.problems = c.problems
    model.metric_stats, model.span_stats = c.metric_stats, c.span_stats
    model.hyperparameters, model.training_config = c.hyperparameters, c.training_config
    model.stragglers = sorted(c.stragglers, key=lambda s: (s.get("step") if isinstance(s.get("step"), int) else -1,
                                                           str(s.get("rank"))))
    model.system = _system(model, c)
    model.curves = c.curves.curves(start)
    c.release_charted()
    model.gpu = build_gpu_health(run, {name for _, name in c.metric_stats}, engine)
    model.goodput, model.goodput_error = goodput
    model.running = (any(s.status == "never ended" and s.name in CRASH_SPANS for s in model.lifecycle)
                     and still_running(run, end))
    model.headline = headline(model, c)
    model.findings = report_findings(model, c, thresholds)
    c.close()
    return model

