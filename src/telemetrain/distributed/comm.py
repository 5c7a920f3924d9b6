"""Communication time per training step, on every rank, without a profiler.

A ``CommMonitor`` (one per ``Telemetry``: ``comm_monitor()``) is told when each collective starts and ends --
``begin``/``end``, called by the instrumentation:

- DDP: ``instrument_ddp(model)`` registers a communication hook that wraps DDP's default all-reduce (or a hook of
  yours, ``hook=``/``state=``): every gradient bucket's all-reduce is timed from the moment DDP hands the bucket over
  to the moment its future completes.
- FSDP2: ``instrument_fsdp(module)`` wraps the all-gather and reduce-scatter of every ``FSDPModule`` in ``module``
  through FSDP2's public ``set_custom_all_gather``/``set_custom_reduce_scatter`` (torch's default comms inside). Not
  covered: HSDP's all-reduce across replicas (FSDP2 offers a hook after it, not around it), and modules with more
  than one parameter group (``shard_placement_fn`` with per-parameter meshes: FSDP2 refuses custom comms there).
- Your own collectives: ``distributed.collectives`` (``all_reduce``, ``all_gather``, ... with torch's signatures),
  or ``with monitor.timed("all_to_all", nbytes):`` around anything.

Each collective is timed on the host (``comm_timing.HOST``: CPU tensors, gloo) or with CUDA events (tensors on a
CUDA device, NCCL: marks on the current stream, read when the window is reported, never a sync on the training
thread). The monitor is a report source of the ``TrainingRecorder``: at each ``training_metrics_update`` the window's
collectives are folded (in the reporter's thread) -- so the figures need a ``TrainingRecorder`` on the same Telemetry;
without one the monitor keeps only the newest ``MAX_WINDOW_OPS`` -- into

- ``comm_count``, ``comm_bytes``, and per kind ``comm_<kind>_count``/``_bytes``/``_time_sec`` (sum of durations);
- ``comm_time_sec`` (wall time with at least one collective in flight) and ``avg_comm_time_sec`` (per iteration);
- ``comm_wait_sec``/``avg_comm_wait_time_sec``: time *waiting* in communication, as opposed to communication that
  overlapped compute. For each stretch of time with collectives in flight, the part after the last collective of the
  stretch was launched: whatever launched it (the end of the backward pass for DDP's last bucket, a blocking call)
  had nothing left to overlap. Exact for blocking collectives and DDP's end-of-backward wait; an estimate otherwise;
- ``comm_wait_fraction``: that wait over the window's wall time less its saves and validation;
  ``avg_<phase>_comm_wait_sec``: where it was waited (the recorder's sub-phase open when the collective was
  launched; ``other`` outside any); ``avg_comm_world_wait_time_sec``: the part of that wait in collectives that span
  every rank of the job (not a subgroup, not send/recv), when there is a process group;
- ``comm_failed`` (collectives that ended in an error), ``comm_open`` (not finished when reported).

The monitor also keeps what a stall watchdog needs: the collectives entered and not left, and the last one that
failed (``open_ops``, ``last_failed``). Failure listeners (``add_failure_listener``) belong to the Telemetry, not to
the monitor: one registered before the first collective is instrumented (the watchdog, at start) hears every failure,
in the thread that sees it -- before the failed collective's error reaches the training thread through DDP's hook.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from ..dispatch import describe, warn_safely
from ..telemetry import Telemetry, get_telemetry
from ..training.names import PHASES
from ..training.recorder import CURRENT
from ..training.reports import REPORT_SOURCES
from .comm_timing import HOST, IntervalClock
from .groups import GroupCounter
from .waited import waited_work

__all__ = ["CommMonitor", "CommOp", "add_failure_listener", "comm_monitor", "instrument_ddp", "instrument_fsdp"]

_EXTENSION = "distributed.comm"
FAILURE_LISTENERS = "distributed.comm.failure_listeners"  # telemetry.extensions: listener(op) per failed collective
OTHER = "other"  # the phase of a collective launched outside any recorder sub-phase
MAX_WINDOW_OPS = 100_000  # collectives kept per window when no report takes them (no TrainingRecorder): the newest


class CommOp:
    """One collective: entered (``state`` "open"), then "done", "failed", or "interrupted" (a KeyboardInterrupt or
    SystemExit left the call: counted, not timed, not a failure)."""

    __slots__ = ("clock", "end", "error", "group", "group_ranks", "group_seq", "group_size", "host_end_ns",
                 "host_start_ns", "kind", "nbytes", "phase", "seq", "start", "state")

    def __init__(self, seq: int, kind: str, nbytes: int, phase: str, clock: IntervalClock,
                 group: tuple[str, str, int, int] = ("", "", 0, 0)) -> None:
        self.seq = seq  # this process's count, every group together
        # the process group (torch's name; "p2p:<a>,<b>" for a pair), its ranks ("0..3"), its size, and this
        # collective's number in it: the one sequence number that is the same on every member
        self.group, self.group_ranks, self.group_size, self.group_seq = group
        self.kind = kind
        self.nbytes = nbytes
        self.phase = phase
        self.clock = clock
        self.state = "open"
        self.error = ""
        self.host_start_ns = start = time.monotonic_ns()
        self.host_end_ns = 0
        self.start: Any = start if clock is HOST else clock.mark()  # (the host clock's mark is that same read)
        self.end: Any = None

    def describe(self, now_ns: int | None = None) -> dict[str, Any]:
        """Plain values for evidence records."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        out: dict[str, Any] = {"kind": self.kind, "seq": self.seq, "bytes": self.nbytes, "phase": self.phase,
                               "state": self.state, "group": self.group, "group_ranks": self.group_ranks,
                               "group_size": self.group_size, "group_seq": self.group_seq}
        if self.state == "open":
            out["open_for_s"] = (now - self.host_start_ns) / 1e9
        if self.error:
            out["error"] = self.error
        return out


class CommMonitor:
    """See the module docstring. Thread-safe for its callers: ``begin`` runs in the thread that launches a collective
    (the training thread, autograd's), ``end`` in the one that sees it complete (gloo's, a CUDA callback's)."""

    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry
        self._seq = itertools.count(1).__next__
        self._groups = GroupCounter()
        self._ops: list[CommOp] = []  # the window's collectives (swapped out at each report)
        self._open: dict[int, CommOp] = {}
        self.last_done: CommOp | None = None
        self.done_seq = 0  # the highest sequence number completed (collectives can complete out of order)
        self.last_failed: CommOp | None = None
        self.count = 0
        self.unreported = 0  # collectives dropped from a window no report took
        self._cuda: IntervalClock | None = None
        self._warned = False
        telemetry.extensions.setdefault(REPORT_SOURCES, []).append(self.capture)

    # -- what the instrumentation calls ------------------------------------------------------------------------------

    def begin(self, kind: str, nbytes: int, *, cuda: bool = False, group: Any = None,
              peers: Iterable[int] | None = None) -> CommOp:
        """A collective starts (``cuda``: its tensors are on a CUDA device: device-timed) on ``group`` (a
        ``ProcessGroup``; ``None``: the default group), or a point-to-point operation with ``peers`` (global ranks)."""
        recorder = self.telemetry.extensions.get(CURRENT)
        current = recorder.phase if recorder is not None else None
        phase = PHASES.get(current[0], OTHER) if current is not None else OTHER
        op = CommOp(self._seq(), kind, nbytes, phase, self._cuda_clock() if cuda else HOST,
                    self._groups.next(group, peers))
        self._open[op.seq] = op
        ops = self._ops
        if len(ops) >= MAX_WINDOW_OPS:  # nobody reports (no recorder): keep memory bounded
            self.unreported += len(ops) // 2
            self._ops = ops = ops[len(ops) // 2:]
        ops.append(op)
        self.count += 1
        return op

    def end(self, op: CommOp, error: BaseException | str | None = None) -> None:
        """The collective completed (or failed with ``error``)."""
        if op.state != "open":
            return
        op.host_end_ns = now = time.monotonic_ns()
        op.end = now if op.clock is HOST else op.clock.mark()
        self._open.pop(op.seq, None)
        if error is None:
            op.state = "done"
            self.last_done = op
            if op.seq > self.done_seq:
                self.done_seq = op.seq
            return
        if isinstance(error, BaseException) and not isinstance(error, Exception):
            # a KeyboardInterrupt/SystemExit raised while the call ran (Python runs a signal's handler once the C++
            # call returns): this process stopping, not the collective failing -- no failure, no listener
            op.state = "interrupted"
            return
        op.state = "failed"
        op.error = error if isinstance(error, str) else describe(error)
        self.last_failed = op
        for listener in list(self.telemetry.extensions.get(FAILURE_LISTENERS, ())):
            try:
                listener(op)
            except Exception as exc:  # noqa: BLE001 - never into the collective's completion path
                self._warn(f"a collective-failure listener failed: {describe(exc)}")

    @contextlib.contextmanager
    def timed(self, kind: str, nbytes: int = 0, *, cuda: bool = False, group: Any = None) -> Iterator[CommOp]:
        """Time a blocking collective (or anything that waits on the other ranks) in a ``with`` block; ``group``:
        the process group it runs on (``None``: the default group), whose sequence numbers it advances."""
        if not isinstance(kind, str) or not kind:
            raise ValueError(f"kind must be a non-empty str, got {kind!r}")
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"nbytes must be an int >= 0, got {nbytes!r}")
        op = self.begin(kind, nbytes, cuda=cuda, group=group)
        try:
            yield op
        except BaseException as exc:
            self.end(op, exc)
            raise
        self.end(op)

    def on_failure(self, listener: Callable[[CommOp], None]) -> None:
        """``listener(op)`` when a collective fails (``add_failure_listener`` on this monitor's Telemetry)."""
        add_failure_listener(self.telemetry, listener)

    def open_ops(self) -> list[CommOp]:
        """The collectives entered and not left, oldest first."""
        return sorted(list(self._open.values()), key=lambda op: op.seq)

    # -- the report source ------------------------------------------------------------------------------------------

    def capture(self) -> Callable[[Mapping[str, Any]], Mapping[str, Any]] | None:
        """On the training thread at a report: take the window's collectives (O(1)); fold them later."""
        ops, self._ops = self._ops, []
        if not ops:
            return None
        return lambda attributes: window_figures(ops, attributes)

    def _cuda_clock(self) -> IntervalClock:
        if self._cuda is None:
            from .comm_timing import CudaEventClock

            self._cuda = CudaEventClock()
        return self._cuda

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            warn_safely(f"telemetrain: {message}")


def window_figures(ops: list[CommOp], attributes: Mapping[str, Any]) -> dict[str, Any]:
    """The report's communication figures from one window's collectives (see the module docstring)."""
    iterations = attributes.get("window_iterations")
    wall = attributes.get("window_seconds")
    out: dict[str, Any] = {"comm_count": len(ops), "comm_bytes": sum(op.nbytes for op in ops)}
    kinds: dict[str, list[float]] = {}  # kind -> [count, bytes, seconds]
    busy = wait = world_wait = 0.0
    by_phase: dict[str, float] = {}
    done = [op for op in ops if op.state == "done"]
    # the wait in the collectives that span every rank (not a subgroup, not send/recv): the only waits that compare
    # across all ranks (``late_rank``)
    world = _world_size()
    for clock in {id(op.clock): op.clock for op in done}.values():
        mine = [op for op in done if op.clock is clock]
        marks = [m for op in mine for m in (op.start, op.end)]
        times = clock.resolve(marks)
        clock.release(marks)
        intervals = [(times[2 * i], max(times[2 * i + 1], times[2 * i]), op) for i, op in enumerate(mine)]
        b, w = _sweep(intervals, by_phase)
        busy += b
        wait += w
        world_wait += _sweep([x for x in intervals if x[2].group_size == world and
                              not x[2].group.startswith("p2p:")], {})[1]
        for start, end, op in intervals:
            k = kinds.setdefault(op.kind, [0, 0, 0.0])
            k[0] += 1
            k[1] += op.nbytes
            k[2] += end - start
    for op in ops:
        if op.state != "done":
            kinds.setdefault(op.kind, [0, 0, 0.0])[0] += 1
            kinds[op.kind][1] += op.nbytes
    for kind, (count, nbytes, total) in sorted(kinds.items()):
        out[f"comm_{kind}_count"] = int(count)
        out[f"comm_{kind}_bytes"] = int(nbytes)
        out[f"comm_{kind}_time_sec"] = total
    out["comm_time_sec"] = busy
    out["comm_wait_sec"] = wait
    if isinstance(iterations, int) and iterations > 0:
        out["avg_comm_time_sec"] = busy / iterations
        out["avg_comm_wait_time_sec"] = wait / iterations
        if world > 1:
            out["avg_comm_world_wait_time_sec"] = world_wait / iterations
        for phase, seconds in sorted(by_phase.items()):
            out[f"avg_{phase}_comm_wait_sec"] = seconds / iterations
    paused = attributes.get("window_paused_seconds")
    if isinstance(paused, (int, float)) and 0 < paused < math.inf and isinstance(wall, (int, float)):
        wall -= paused  # the time training ran, as the report's rates: a long save is not a share of the iterations
    if isinstance(wall, (int, float)) and wall > 0 and math.isfinite(wall):
        out["comm_wait_fraction"] = wait / wall
    failed = sum(op.state == "failed" for op in ops)
    still_open = sum(op.state == "open" for op in ops)
    if failed:
        out["comm_failed"] = failed
    if still_open:
        out["comm_open"] = still_open
    out["comm_clock"] = "+".join(sorted({op.clock.name for op in ops}))
    return out


def _world_size() -> int:
    """The job's size (0: no process group): the collectives on a group this big span every rank."""
    dist = sys.modules.get("torch.distributed")
    try:
        return int(dist.get_world_size()) if dist is not None and dist.is_initialized() else 0
    except Exception:  # noqa: BLE001 - a process group torch has destroyed: unknown
        return 0


def _sweep(intervals: list[tuple[float, float, CommOp]], by_phase: dict[str, float]) -> tuple[float, float]:
    """(busy, wait): the union of the intervals, and per stretch of overlapping intervals the time from the last start
    in it to its end (added to ``by_phase`` under the phase of the collective that started last)."""
    busy = wait = 0.0
    stretch_start = stretch_end = last_start = -math.inf
    last_phase = OTHER
    for start, end, op in sorted(intervals, key=lambda x: (x[0], x[1])):
        if start > stretch_end:
            if stretch_end > -math.inf:
                busy += stretch_end - stretch_start
                wait += stretch_end - last_start
                by_phase[last_phase] = by_phase.get(last_phase, 0.0) + stretch_end - last_start
            stretch_start, stretch_end = start, end
        else:
            stretch_end = max(stretch_end, end)
        last_start, last_phase = start, op.phase
    if stretch_end > -math.inf:
        busy += stretch_end - stretch_start
        wait += stretch_end - last_start
        by_phase[last_phase] = by_phase.get(last_phase, 0.0) + stretch_end - last_start
    return busy, wait


def add_failure_listener(telemetry: Telemetry, listener: Callable[[CommOp], None]) -> None:
    """``listener(op)`` whenever a collective timed on ``telemetry`` fails, from now on, whether or not its
    ``CommMonitor`` exists yet. It runs in the thread that sees the failure (gloo's, a CUDA callback's, the training
    thread's for an error raised at launch): keep it short; what it raises is warned about once, never passed on."""
    if not callable(listener):
        raise TypeError(f"listener must be callable (op) -> None, got {type(listener).__name__}")
    telemetry.extensions.setdefault(FAILURE_LISTENERS, []).append(listener)  # (setdefault: atomic)


def comm_monitor(telemetry: Telemetry | None = None) -> CommMonitor:
    """The ``CommMonitor`` of ``telemetry`` (default: the default instance), created on first use."""
    t = telemetry if telemetry is not None else get_telemetry()
    found: CommMonitor = t.extension(_EXTENSION, CommMonitor)
    return found


# -- DDP ---------------------------------------------------------------------------------------------------------------


def instrument_ddp(model: Any, *, hook: Callable[[Any, Any], Any] | None = None, state: Any = None,
                   telemetry: Telemetry | None = None) -> CommMonitor:
    """Register a communication hook on the ``DistributedDataParallel`` ``model`` that times each bucket's
    all-reduce: DDP's default all-reduce (``torch.distributed.algorithms.ddp_comm_hooks.default_hooks
    .allreduce_hook`` on the model's process group), or ``hook(state, bucket)`` of yours (PowerSGD, fp16
    compression...). DDP allows one hook per model: call this instead of ``model.register_comm_hook``."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    if not callable(getattr(model, "register_comm_hook", None)):
        raise TypeError(f"model must be a DistributedDataParallel, got {type(model).__name__}")
    if hook is not None and not callable(hook):
        raise TypeError(f"hook must be callable (state, bucket) -> Future, got {type(hook).__name__}")
    monitor = comm_monitor(telemetry)
    inner = hook if hook is not None else default_hooks.allreduce_hook
    group = getattr(model, "process_group", None)  # (DDP's group: the buckets' all-reduces run on it)
    inner_state: Any = state if hook is not None else group

    def timed_allreduce(state: Any, bucket: Any) -> Any:
        buffer = bucket.buffer()
        op = monitor.begin("all_reduce", buffer.numel() * buffer.element_size(), cuda=buffer.is_cuda, group=group)
        try:
            future = inner(inner_state, bucket)
        except BaseException as exc:
            monitor.end(op, exc)
            raise

        def done(f: Any) -> Any:
            try:
                value = f.value()
            except BaseException as exc:
                monitor.end(op, exc)
                raise
            monitor.end(op)
            return value

        return future.then(done)

    timed_allreduce.__annotations__ = {}  # DDP checks them, and would read these (strings here) as wrong types
    model.register_comm_hook(None, timed_allreduce)
    return monitor


# -- FSDP2 -------------------------------------------------------------------------------------------------------------


def instrument_fsdp(module: Any, *, telemetry: Telemetry | None = None) -> int:
    """Time the all-gathers and reduce-scatters of every FSDP2 ``FSDPModule`` in ``module`` (itself included), by
    wrapping torch's default comms with ``set_custom_all_gather``/``set_custom_reduce_scatter``. Returns how many
    modules were instrumented; a module FSDP2 refuses custom comms for is skipped (warned once). Call it after
    ``fully_shard`` and before the first forward; it replaces custom comms you set before."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as collectives

    if not callable(getattr(module, "modules", None)):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    monitor = comm_monitor(telemetry)
    done = 0
    for m in module.modules():
        if not isinstance(m, FSDPModule):
            continue
        try:
            m.set_custom_all_gather(_timed_comm(collectives.DefaultAllGather(), "all_gather", monitor))
            m.set_custom_reduce_scatter(_timed_comm(collectives.DefaultReduceScatter(), "reduce_scatter", monitor))
        except (ValueError, RuntimeError) as exc:
            monitor._warn(f"FSDP module {type(m).__name__} not instrumented: {describe(exc)}")
            continue
        done += 1
    return done


def _timed_comm(inner: Any, kind: str, monitor: CommMonitor) -> Any:
    """An FSDP2 ``AllGather``/``ReduceScatter`` that times ``inner`` (same allocation, same call)."""
    base = type(inner).__mro__[1:]  # (the ABC FSDP2 expects, found without importing its private module by name)

    class Timed(*[b for b in base if b.__name__ in ("AllGather", "ReduceScatter")]):  # type: ignore[misc]
        def allocate(self, size: Any, *, dtype: Any, device: Any) -> Any:
            return inner.allocate(size, dtype=dtype, device=device)

        def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, *args: Any, **kwargs: Any) -> Any:
            return _launch(monitor, kind, input_tensor, output_tensor, lambda: inner(output_tensor, input_tensor,
                                                                                      group, *args, **kwargs),
                           group=group)

    Timed.__name__ = f"Timed{type(inner).__name__}"
    return Timed()


def tensor_bytes(*tensors: Any) -> int:
    """Bytes of the largest tensor given (the payload of a collective: its input for an all-reduce, its output for
    an all-gather); lists of tensors count in full."""
    best = 0
    for t in tensors:
        if isinstance(t, (list, tuple)):
            size = sum(x.numel() * x.element_size() for x in t if hasattr(x, "numel"))
        elif hasattr(t, "numel"):
            size = t.numel() * t.element_size()
        else:
            continue
        best = max(best, size)
    return best


def _is_cuda(*tensors: Any) -> bool:
    for t in tensors:
        if isinstance(t, (list, tuple)):
            if any(getattr(x, "is_cuda", False) for x in t):
                return True
        elif getattr(t, "is_cuda", False):
            return True
    return False


def _launch(monitor: CommMonitor, kind: str, payload: Any, other: Any, call: Callable[[], Any], *, group: Any = None,
            peers: Iterable[int] | None = None) -> Any:
    """Run ``call`` (a torch.distributed collective on ``group``, or point-to-point with ``peers``, blocking or
    ``async_op``) timed: a returned ``Work`` is timed to its future's completion, anything else to the call's return
    (for NCCL the end mark is on the current stream, which a blocking collective has made wait for the
    collective)."""
    op = monitor.begin(kind, tensor_bytes(payload, other), cuda=_is_cuda(payload, other), group=group, peers=peers)
    try:
        work = call()
    except BaseException as exc:
        monitor.end(op, exc)
        raise
    if isinstance(work, list):  # batch_isend_irecv's works: done when the last one is
        return _until_all(monitor, op, work)
    if work is None:  # (torch returns None to a rank outside the group)
        monitor.end(op)
        return work
    return _until_all(monitor, op, [work])[0]


def _until_all(monitor: CommMonitor, op: CommOp, works: list[Any]) -> list[Any]:
    """``op`` ends when every work has completed (failed: at the first failure): told by its future, or for a work
    without one (gloo's point-to-point works) when the caller waits it -- which then gets a ``Work`` that says so
    (``waited.waited_work``). Anything that is not a work: timed to the launch."""
    left = itertools.count(len(works) - 1, -1).__next__  # (atomic: the callbacks run in the backend's threads)

    def done(error: BaseException | None) -> None:
        if error is not None:
            monitor.end(op, error)
        elif left() == 0:
            monitor.end(op)

    def on_future(f: Any) -> None:
        try:
            f.wait()
        except BaseException as exc:  # noqa: BLE001 - recorded; the caller's own wait() raises it
            done(exc)
            return
        done(None)

    out = []
    for work in works:
        get_future = getattr(work, "get_future", None)
        future = None
        if get_future is not None:
            try:
                future = get_future()
            except Exception:  # noqa: BLE001 - "Work::getFuture not implemented": seen when waited
                out.append(waited_work(work, done))
                continue
        if future is None:  # not a work
            done(None)
            out.append(work)
            continue
        future.add_done_callback(on_future)
        out.append(work)
    if not works:
        monitor.end(op)
    return out
