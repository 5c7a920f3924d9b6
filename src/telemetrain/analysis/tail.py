"""``telemetrain tail``: a live terminal view of a run being written.

The process files are read incrementally: each file's offset is kept, and a last line without its newline (a write
in progress) is held back until it is complete. Only events, diagnostics and process headers are decoded (the view
needs nothing else), so following a busy run costs little. What is kept is bounded: per rank the latest report, and
the last few notable events. ``rich`` is imported when the view is drawn (the ``report`` extra).
"""

from __future__ import annotations

import heapq
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ..cli_common import few
from ..identity import Identity
from ..report.curves import CurveBuilder, pick_loss
from ..store.codec import decode_line
from ..store.layout import MAX_LINE_BYTES, is_agent_file, is_process_file
from ..text import printable
from .findings import Findings, InputBuilder, analyse
from .findings.checkpoints import CHECKPOINT_SAVES
from .samples import open_run_meta
from .tail_progress import Pace, files_in_start_order, format_eta, loss_line, target_of

__all__ = ["FileFollower", "RankState", "TailState", "render", "run_tail"]

RECENT_EVENTS = 10
_NOTABLE_SEVERITIES = ("warning", "error", "critical")
# training events worth seeing as they happen (training_metrics_update is summarised per rank instead)
_NOTABLE_TRAINING = ("save_checkpoint_success", "validation_metrics_update", "testing_metrics_update",
                     "one_logger_initialization")
_WANTED = (b'"event"', b'"diagnostic"', b'"process"')
_LOOP_END = b'"name":"training_loop"'  # of the span_end lines, the training loop's are decoded, and those not ok
# and the checkpoint saves' starts (the iteration saved) and ends: the slow checkpoint rank rule's input
_SAVES = tuple(f'"name":"{n}"'.encode() for n in sorted(CHECKPOINT_SAVES))
_STATUS = b'"status":"'  # a span end's own status: the first (the writer puts it before the attributes)
# of the metric lines, only those the findings engine reads: memory gauges, losses and gradient norms
_METRIC_WORDS = (b"memory", b"loss", b"grad")
FINDINGS_HISTORY = 2000  # windows per rank and points per series the live findings look back over


class FileFollower:
    """One growing process file: what was appended since the last ``poll``, as records."""

    def __init__(self, path: Path, meta: dict[str, Any], metric_words: tuple[bytes, ...] = _METRIC_WORDS) -> None:
        self.path = path
        self.meta = meta
        self.metric_words = metric_words
        self.offset = 0
        self.pending = b""  # a line whose newline has not been written yet
        self.skipping = False  # inside a line longer than the format's cap, dropped up to its newline
        self.identity: Identity | None = None
        self.corrupt = 0

    def poll(self) -> list[Any]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return []
        self.offset += len(data)
        if not data:
            return []
        lines = (self.pending + data).split(b"\n")
        self.pending = lines.pop()
        if self.skipping and lines:  # the end of a line past the cap, its start dropped already
            lines[0], self.skipping = b"", False
        if len(self.pending) > MAX_LINE_BYTES:  # a line no reader reads (the format's cap): not held until it ends
            self.corrupt += 0 if self.skipping else 1
            self.pending, self.skipping = b"", True
        records = []
        for raw in lines:
            if not raw.strip():
                continue
            if self.identity is None or b'"process"' in raw[:40]:
                if self._header(raw):
                    continue
            head = raw[:40]
            if not any(w in head for w in _WANTED) and \
                    not (b'"span_end"' in head and (_LOOP_END in raw or not _ended_ok(raw))) and \
                    not ((b'"span_end"' in head or b'"span_start"' in head) and any(n in raw for n in _SAVES)) and \
                    not (b'"metric"' in head and any(w in raw for w in self.metric_words)):
                if not raw.rstrip().endswith(b"}"):  # a line cut short (a kill or a full disk mid-write), of a kind
                    self.corrupt += 1  # not decoded here: counted all the same, as the SQL catch-up counts it
                continue
            try:
                rec = decode_line(raw, self._identity())
            except (ValueError, KeyError, TypeError, IndexError, AttributeError):
                self.corrupt += 1
                continue
            if not isinstance(rec, dict):
                records.append(rec)
        return records

    def _header(self, raw: bytes) -> bool:
        try:
            obj = json.loads(raw)
            if isinstance(obj, dict) and obj.get("kind") == "process":
                self.identity = Identity.from_dict(obj["identity"])
                return True
        except (ValueError, KeyError, TypeError):
            pass
        return False

    def _identity(self) -> Identity:
        if self.identity is None:  # header lost: what the file name and run.json tell (as the reader does)
            from ..store.reader import fallback_identity

            self.identity = fallback_identity(self.path, self.meta)
        return self.identity


RecentEvent = tuple[int, int | str, str, str, str]  # wall_ns, who (a rank, or "agent N"), severity, event, text


def _ended_ok(raw: bytes) -> bool:
    """Whether a span end's line says status ok (a line of another layout is decoded and its status read)."""
    at = raw.find(_STATUS)
    return at >= 0 and raw.startswith(b'ok"', at + len(_STATUS))


class RecentEvents:
    """The latest ``size`` notable events by wall time, whatever order the files are read in: the first frame reads
    the ranks one after another, and keeping the last ones read would show a job of many ranks as its last ranks'
    events. Ties are broken by the event's text, so every reader keeps the same ones."""

    def __init__(self, size: int = RECENT_EVENTS) -> None:
        self.size = size
        self._heap: list[tuple[tuple[int, str, str, str, str], RecentEvent]] = []

    def add(self, event: RecentEvent) -> None:
        key = (event[0], str(event[1]), event[2], event[3], event[4])
        if len(self._heap) < self.size:
            heapq.heappush(self._heap, (key, event))
        elif key > self._heap[0][0]:
            heapq.heapreplace(self._heap, (key, event))

    def __iter__(self) -> Iterator[RecentEvent]:
        """Oldest first."""
        return iter([event for _, event in sorted(self._heap)])

    def __len__(self) -> int:
        return len(self._heap)


@dataclass
class RankState:
    """The latest training report of one rank."""

    rank: int
    iteration: int | None = None
    wall_ns: int = 0  # when the report was written
    samples_per_second: float | None = None
    p50: float | None = None
    p99: float | None = None
    mean: float | None = None
    final: bool = False
    reports: int = 0
    loop_status: str | None = None  # how its last training loop ended: ok, error, terminated; None while open


@dataclass
class TailState:
    """What the view shows, updated from new records."""

    path: Path
    run_id: str = ""
    perf_tag: str = ""
    ranks: dict[int, RankState] = field(default_factory=dict)
    recent: RecentEvents = field(default_factory=RecentEvents)
    errors: int = 0
    warnings: int = 0
    diagnostics: int = 0
    spans_not_ok: int = 0  # spans that ended in error or terminated (a failed checkpoint save, a crashed loop)
    records: int = 0
    followers: dict[Path, FileFollower] = field(default_factory=dict)
    # the launcher agents' files, for their events (worker exits, stalls: the findings'; restarts): few, read whole
    agents: dict[Path, FileFollower] = field(default_factory=dict)
    corrupt_before: int = 0  # counted by the SQL catch-up
    inputs: InputBuilder = field(default_factory=lambda: InputBuilder(limit=FINDINGS_HISTORY))
    loss: str | None = None  # the loss metric's name (or group/name); None: picked by name (curves.pick_loss)
    curves: CurveBuilder = field(default_factory=lambda: CurveBuilder(capacity=64))  # the loss-like series
    pace: Pace = field(default_factory=Pace)
    target: int | None = None  # train_iterations_target, from the config event or a report
    starts: dict[Path, int] = field(default_factory=dict)  # a process file's first header's wall time (0: none yet)

    def findings(self) -> Findings:
        """The findings engine on what was read so far (a loop still open is not a crash)."""
        return analyse(self.inputs.build(open_spans_crashed=False))

    def poll(self) -> int:
        """Read what was appended to the run (new files included); returns the number of new records."""
        meta = open_run_meta(self.path)
        self.run_id = str(meta.get("run_id") or self.path.name)
        self.perf_tag = str(meta.get("perf_tag") or self.perf_tag)
        files = self._process_files()
        new = 0
        for f in files_in_start_order([f for f in files if not is_agent_file(f.name)], self.starts):
            follower = self.followers.get(f)
            if follower is None:
                words = _METRIC_WORDS + ((self.loss.rsplit("/", 1)[-1].encode(),) if self.loss else ())
                follower = self.followers[f] = FileFollower(f, meta, words)
            for rec in follower.poll():
                self._add(rec)
                new += 1
        new += self.poll_agents(meta, files)
        self.records += new
        return new

    def poll_agents(self, meta: dict[str, Any], files: list[Path] | None = None) -> int:
        """Read what the launcher agents appended (``files``: the run folder's process files, else listed here);
        returns the number of new records (not added to ``records``: the caller does)."""
        new = 0
        for f in sorted(f for f in (files if files is not None else self._process_files()) if is_agent_file(f.name)):
            follower = self.agents.get(f)
            if follower is None:
                follower = self.agents[f] = FileFollower(f, meta, metric_words=())
            for rec in follower.poll():
                if rec.kind == "event":
                    self._agent_event(rec)
                new += 1
        return new

    def _process_files(self) -> list[Path]:
        try:
            return [f for f in self.path.iterdir() if is_process_file(f.name)]
        except OSError:
            return []

    def catch_up(self, engine: Any) -> None:
        """The run as it stands, by SQL (``store.engine``, over this run): the same state as polling every file from
        its start, without reading the files in Python; the followers then start where the engine stopped reading
        each file, so nothing is missed or counted twice. The corrupt lines counted are all the run's (polling counts
        those among the lines it decodes, and every line cut short)."""
        from .tail_sql import catch_up

        catch_up(self, engine)

    @property
    def pending_lines(self) -> int:
        return sum(1 for f in self.followers.values() if f.pending)

    @property
    def corrupt(self) -> int:
        return self.corrupt_before + sum(f.corrupt for f in self.followers.values())

    def _add(self, r: Any) -> None:
        rank = r.identity.rank
        if r.kind == "span_end":
            self._span_end(rank, r)
            return
        if r.kind == "span_start":  # (a checkpoint save's: the iteration it saves)
            self.inputs.add(r)
            return
        self.inputs.add(r)
        if r.kind == "metric":
            self.curves.add(rank, r.group, r.name, r.step, r.value, r.wall_ns, r.unit)
            return
        if r.kind == "diagnostic":
            self.diagnostics += 1
            self.recent.add((r.wall_ns, rank, "diagnostic", f"{r.name} {r.sink}", r.message))
            return
        if r.group == "training" and r.name == "training_metrics_update":
            self._report(rank, r)
            return
        if r.group == "training":
            self.target = target_of(r.attributes or {}) or self.target
        severity = r.severity
        self._count(severity)
        if severity in _NOTABLE_SEVERITIES or (r.group == "training" and r.name in _NOTABLE_TRAINING):
            self.recent.add((r.wall_ns, rank, severity, f"{r.group}/{r.name}", _brief(r.attributes)))

    def _span_end(self, rank: int, r: Any) -> None:
        """A training loop's end (the rank's loop status, the findings' input) or a span that ended not ok."""
        if r.name == "training_loop" and r.group == "training":
            self._rank(rank).loop_status = r.status
            self.inputs.add(r)  # (the findings take the loops' and saves' ends alone, as the SQL catch-up feeds them)
        elif r.name in CHECKPOINT_SAVES:
            self.inputs.add(r)
        if r.status != "ok":
            self.spans_not_ok += 1
            self.recent.add((r.wall_ns, rank, "error" if r.status == "error" else "warning",
                             f"span {r.group}/{r.name}", f"{r.status}: {r.error}" if r.error else r.status))

    def _agent_event(self, r: Any) -> None:
        """An event of a launcher agent: the findings' (its worker exits and stalls), and a notable one shown."""
        self.inputs.add(r)
        if r.severity in _NOTABLE_SEVERITIES:
            self._count(r.severity)
            self.recent.add((r.wall_ns, f"agent {r.identity.group_rank}", r.severity, f"{r.group}/{r.name}",
                                _brief(r.attributes)))

    def _count(self, severity: str) -> None:
        if severity in ("error", "critical"):
            self.errors += 1
        elif severity == "warning":
            self.warnings += 1

    def _rank(self, rank: int) -> RankState:
        s = self.ranks.get(rank)
        if s is None:
            s = self.ranks[rank] = RankState(rank)
        return s

    def loss_summary(self, width: int = 40) -> str:
        """The loss's sparkline over the whole run so far, and its latest value."""
        picked = pick_loss(self.curves.names(), self.loss)
        curve = self.curves.curve(*picked) if picked else None
        if curve is None or not curve.lines:
            return "-" if self.loss is None else f"- (no metric named {self.loss!r} yet)"
        spark, latest, step = loss_line(curve, width)
        at = f" at step {step:,}" if step >= 0 else ""
        return f"{spark}  {latest:.4g}{at}  ({curve.title})" if latest is not None else f"{spark}  ({curve.title})"

    def eta(self) -> str:
        top = max((s.iteration for s in self.ranks.values() if s.iteration is not None), default=None)
        seconds = self.pace.eta_seconds(self.target, top)
        return format_eta(seconds, self.target, top, self.status() == "finished")

    def status(self) -> str:
        """waiting (no report yet), training, finished (every rank's loop ended ok), or stopped (a loop ended
        otherwise: an exception, SIGTERM)."""
        ranks = list(self.ranks.values())
        if not ranks:
            return "waiting for the first report"
        ended = [s.loop_status for s in ranks]
        if all(e == "ok" for e in ended):
            return "finished"
        stopped = sorted({e for e in ended if e not in (None, "ok")})
        if stopped and all(e is not None for e in ended):
            return f"stopped ({', '.join(stopped)})"
        return "training"

    def _report(self, rank: int, r: Any) -> None:
        a = r.attributes or {}
        s = self._rank(rank)
        s.loop_status = None  # a report: its loop is open (again)
        iteration = a.get("current_iteration")
        if isinstance(iteration, int):
            s.iteration = iteration
            n, seconds = a.get("window_iterations"), _number(a.get("window_seconds"))
            self.pace.report(rank, r.wall_ns, iteration, n if isinstance(n, int) else None, seconds)
        self.target = target_of(a) or self.target
        s.wall_ns = r.wall_ns
        s.samples_per_second = _number(a.get("samples_per_second"))
        s.p50 = _number(a.get("p50_iteration_time_sec"))
        s.p99 = _number(a.get("p99_iteration_time_sec"))
        s.mean = _number(a.get("avg_iteration_time_sec"))
        s.final = bool(a.get("final"))
        s.reports += 1


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _brief(attributes: Any, limit: int = 80) -> str:
    """A few scalar attributes, numbers shortened."""
    if not isinstance(attributes, dict):
        return ""
    parts = []
    for k, v in attributes.items():
        if isinstance(v, float):
            parts.append(f"{k}={v:.4g}")
        elif isinstance(v, (int, str, bool)) and not str(k).startswith("torchelastic."):
            parts.append(f"{k}={v}")
    text = " ".join(parts)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f} ms"


def _ago(wall_ns: int, now_ns: int) -> str:
    if not wall_ns:
        return "-"
    seconds = max(0.0, (now_ns - wall_ns) / 1e9)
    return f"{seconds:.0f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"


def render(state: TailState, now_ns: int | None = None) -> Any:
    """The frame: a rich renderable (rich must be importable)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    now_ns = time.time_ns() if now_ns is None else now_ns
    ranks = sorted(state.ranks.values(), key=lambda s: s.rank)
    latest = max((s for s in ranks if s.iteration is not None), key=lambda s: s.wall_ns, default=None)
    top = max((s.iteration for s in ranks if s.iteration is not None), default=None)
    status = state.status()
    head = Text(printable(f"run {state.run_id}  perf_tag {state.perf_tag}  {status}  ({state.path})"), style="bold")
    summary = Table.grid(padding=(0, 2))
    summary.add_row("iteration", "-" if top is None else str(top),
                    "throughput", "-" if latest is None or latest.samples_per_second is None
                    else f"{latest.samples_per_second:,.1f} samples/s")
    summary.add_row("iteration time", "-" if latest is None else f"p50 {_ms(latest.p50)}  p99 {_ms(latest.p99)}",
                    "problems", f"{state.errors} errors, {state.warnings} warnings, {state.spans_not_ok} spans not ok, "
                    f"{state.diagnostics} diagnostics, {state.corrupt} corrupt lines")
    model = Table.grid(padding=(0, 2))  # the model's side: the loss so far, the way to the target
    model.add_row("loss", Text(printable(state.loss_summary())))
    model.add_row("ETA", state.eta())
    shown, hidden = few(ranks, keep=_outliers(ranks))
    per_rank = Table(title="ranks (latest report" + (f"; the first and the outliers of {len(ranks)}: the furthest "
                                                      "behind, the slowest, the longest silent, a loop that failed"
                                                      if hidden else "") + ")", title_justify="left")
    for column in ("rank", "iteration", "behind", "mean", "p50", "p99", "samples/s", "updated"):
        per_rank.add_column(column, justify="right")
    for s in shown:
        behind = "-" if top is None or s.iteration is None else str(top - s.iteration)
        ended = "" if s.loop_status is None else f" (loop {s.loop_status})"
        per_rank.add_row(str(s.rank), "-" if s.iteration is None else str(s.iteration), behind, _ms(s.mean),
                         _ms(s.p50), _ms(s.p99), "-" if s.samples_per_second is None
                         else f"{s.samples_per_second:,.1f}", _ago(s.wall_ns, now_ns) + ended)
    if hidden:
        per_rank.add_row(f"+{hidden}", "", "", "", "", "", "", "more ranks")
    result = state.findings()
    findings: Any = Text("findings: none so far (`telemetrain docs report findings` says what each rule looks for)")
    if result.findings or result.notes:  # (an empty table would be a header and nothing)
        findings = Table(title=f"findings ({len(result.findings)}; `telemetrain docs report findings`)",
                         title_justify="left")
        for column in ("severity", "finding", "evidence"):
            findings.add_column(column)
        for f in result.findings[:10]:
            style = "red" if f.severity in ("error", "critical") else ("yellow" if f.severity == "warning" else "")
            findings.add_row(Text(f.severity, style=style), Text(printable(f.title)),
                             Text(printable(f.evidence.summary() if f.evidence else "")))
        for n in result.notes[:3]:
            findings.add_row("note", Text(printable(n.text)), "")
    events = Table(title="recent events", title_justify="left")
    for column in ("when", "rank", "severity", "event", "attributes"):
        events.add_column(column)
    for wall_ns, rank, severity, name, text in state.recent:
        style = "red" if severity in ("error", "critical") else ("yellow" if severity == "warning" else "")
        events.add_row(_ago(wall_ns, now_ns), str(rank), Text(severity, style=style), Text(printable(name)),
                       Text(printable(text)))
    return Group(head, summary, model, per_rank, findings, events)


def _outliers(ranks: list[RankState]) -> Callable[[RankState], bool]:
    """Which ranks a long table keeps besides its first rows: the one furthest behind, the slowest (mean iteration
    time), the one silent the longest, and any whose loop ended other than ok."""
    reported = [s for s in ranks if s.iteration is not None]
    picked = {id(s) for s in (
        min(reported, key=lambda s: s.iteration or 0, default=None),
        max((s for s in reported if s.mean is not None), key=lambda s: s.mean or 0.0, default=None),
        min(ranks, key=lambda s: s.wall_ns, default=None)) if s is not None}
    return lambda s: id(s) in picked or s.loop_status not in (None, "ok")


def run_tail(path: Path, out: TextIO, *, interval: float, once: bool,
             sleep: Callable[[float], None] = time.sleep, loss: str | None = None) -> int:
    """Draw the view of ``path`` on ``out``: one frame with ``once``, else refreshed every ``interval`` seconds until
    interrupted (on a file or a pipe, one frame after the other); ``loss``: the metric the loss sparkline shows
    (default: picked by name)."""
    from rich.console import Console
    from rich.live import Live

    from ..store.engine import engine_for

    state = TailState(path, loss=loss)
    engine = engine_for([path])  # DuckDB when installed: the run as it stands by SQL, then only what is new
    if engine is not None:
        try:
            state.catch_up(engine)
        finally:
            engine.close()
    state.poll()
    if once:
        Console(file=out, width=120).print(render(state))
        return 0
    console = Console(file=out)
    if not console.is_terminal:  # (rich's Live draws a file or a pipe once, at exit: `tail > log` stayed empty)
        console = Console(file=out, width=120)
        try:
            while True:
                console.print(render(state))
                out.flush()
                sleep(interval)
                state.poll()
        except KeyboardInterrupt:
            return 0
    try:
        with Live(render(state), console=console, auto_refresh=False, transient=False) as live:
            while True:
                sleep(interval)
                state.poll()
                live.update(render(state), refresh=True)
    except KeyboardInterrupt:
        return 0
