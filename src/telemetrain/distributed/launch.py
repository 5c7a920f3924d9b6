"""``telemetrain launch``: torchrun, with the elastic agent's own telemetry in the job's run store.

torchrun's agent emits rendezvous timings, worker states, restarts, success/failure and flakiness, but into null
handlers (torch's ``distributed/elastic/metrics/api.py``, ``events/handlers.py``; docs/distributed.md). This launcher
is torchrun itself -- same flags, parsed by torchrun's own parser, run by ``torch.distributed.run.run`` and the elastic
agent, with no rendezvous of our own -- after three changes in the agent process:

1. A job id, when torchrun would make up a random one (``--standalone``, or one node without a rendezvous
   endpoint): a sortable ``YYYYmmddTHHMMSSZ-xxxxxx``, given to torchrun as ``--rdzv-id``. It becomes the workers'
   ``TORCHELASTIC_RUN_ID``, so every worker of every attempt agrees on the session (the job) and the run id
   ``<job>.<restart count>`` (one attempt) without talking (identity.identity_from_env).
2. A Telemetry for the agent, writing ``agent-<node>.<pid>.jsonl`` into the same run folder as the workers, with the
   torchelastic bridge (integrations.torchelastic) installed: the agent's metrics, worker events and rendezvous
   events land there. When the agent restarts the worker group, its own records follow into the next attempt's folder.
3. Environment for the workers: ``TELEMETRAIN_PERF_TAG`` (the entry script, so agent and workers agree),
   ``TELEMETRAIN_CROSS_RANK=1`` (cross-rank aggregation) and ``TELEMETRAIN_WATCHDOG=1`` (the stall watchdog),
   unless already set. With the watchdog on, the agent follows the ranks' stall evidence and writes one ``stall``
   event naming the ranks stuck elsewhere than the others (``stall_view.StallWatcher``).
4. With restarts allowed, ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` unless set: torch's c10d rendezvous otherwise
   serves every attempt's workers from one store with no per-attempt prefix, and a restarted worker can read the
   dead attempt's gloo/NCCL addresses and fail or hang in ``init_process_group`` (pytorch/pytorch#135712 and
   #167288; here 4 restarts in 6 failed with plain torchrun 2.13, none in 6 with the variable set).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .. import process_hooks
from ..containment import describe
from ..dispatch import warn_safely
from ..identity import identity_from_env, new_run_id
from ..span_lifecycle import describe_end
from ..store.layout import AGENT_ROLE
from ..telemetry import Telemetry

__all__ = ["AttemptFollower", "environment", "main"]

GROUP = "launcher"


class AttemptFollower:
    """Moves the agent's records to the next attempt's run when the agent restarts the workers.

    The agent's monitor loop emits ``workers.<role>.remaining_restarts`` then ``workers.<role>.<state>``; on
    ``failed``/``unhealthy`` with restarts left it restarts the group, and the new workers get
    ``TORCHELASTIC_RESTART_COUNT`` one higher. Following those two metrics keeps the agent's count equal to theirs.
    """

    def __init__(self, telemetry: Telemetry, job: str | None) -> None:
        self.telemetry = telemetry
        self.job = job  # None: the run id was fixed by $TELEMETRAIN_RUN_ID, keep it
        self.attempt = 0
        self.remaining: int | None = None

    def on_metric(self, group: str, name: str, value: Any) -> None:
        parts = name.split(".")
        if group != "torchelastic" or len(parts) != 3 or parts[0] != "workers":
            return
        if parts[2] == "remaining_restarts" and isinstance(value, int):
            self.remaining = value
        elif parts[2] in ("failed", "unhealthy") and self.remaining is not None and self.remaining > 0:
            self.attempt += 1
            self.remaining -= 1
            changes: dict[str, Any] = {"restart_count": self.attempt}
            if self.job is not None:
                changes["run_id"] = f"{self.job}.{self.attempt}"
            self.telemetry.set_identity(**changes)
            self.telemetry.event("attempt_start", {"attempt": self.attempt, "reason": parts[2],
                                                   "remaining_restarts": self.remaining}, group=GROUP)


@contextlib.contextmanager
def environment(values: Mapping[str, str] | None = None, defaults: Mapping[str, str] | None = None) -> Iterator[None]:
    """``os.environ`` with ``values`` set and ``defaults`` set where absent, restored on exit (the launcher's
    changes are for its workers; a program that calls ``main`` or the demo in-process keeps its own)."""
    keys = [*(values or {}), *(defaults or {})]
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(values or {})
    for k, v in (defaults or {}).items():
        os.environ.setdefault(k, v)
    try:
        yield
    finally:
        for k, old in saved.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old


def _entry_stem(args: Any) -> str:
    script = str(args.training_script)
    if args.module:
        return script.rsplit(".", 1)[-1]
    return os.path.splitext(os.path.basename(script))[0] or "python"


def _choose_rendezvous(args: Any, max_nodes: int) -> None:
    """Where torchrun would pick a random uuid for the rendezvous id, pick a sortable job id instead (same
    rendezvous: c10d on localhost, as torchrun does)."""
    if args.standalone:
        args.standalone = False
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", new_run_id()
    elif args.rdzv_backend == "static" and not args.rdzv_endpoint and args.master_port is None and max_nodes == 1:
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", new_run_id()


def _agent_telemetry(args: Any, job_env: str, world_size: int) -> Telemetry:
    env = dict(os.environ)
    env["TORCHELASTIC_RUN_ID"] = job_env
    env["TORCHELASTIC_RESTART_COUNT"] = "0"
    node = int(args.node_rank)
    identity = identity_from_env(env, role=AGENT_ROLE, rank=node, local_rank=0, group_rank=node,
                                 world_size=max(world_size, node + 1))
    return Telemetry(identity)  # the launch config goes into the launch_start event; run.json is the workers' to write


def main(argv: Sequence[str]) -> int:
    """Run torchrun with ``argv`` (torchrun's flags, then the script and its arguments); torchrun's exit status."""
    from torch.distributed import run as torchrun

    parser = torchrun.get_args_parser()
    parser.prog = "telemetrain launch"
    parser.description = (  # torchrun's parser, so the help is torchrun's: it also says what the launcher adds
        "torchrun (its flags, its elastic agent and rendezvous), with the agent's metrics and events written into "
        "the job's run store beside the workers' ($TELEMETRAIN_DIR, default ./telemetrain-runs). Where torchrun "
        "would make up a random rendezvous id (--standalone, one node without an endpoint), the job gets a sortable "
        "one, the session of every attempt. See `telemetrain docs distributed`.")
    parser.epilog = (
        "Set for the workers unless already set: TELEMETRAIN_PERF_TAG (the script's name), TELEMETRAIN_CROSS_RANK=1 "
        "(cross-rank aggregation), TELEMETRAIN_WATCHDOG=1 (the stall watchdog; the agent then writes one `stall` "
        "event naming the ranks stuck elsewhere than the others) and, with --max-restarts above 0, "
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (a restarted worker must not read the dead attempt's addresses).")
    args = parser.parse_args(list(argv))
    max_nodes = _check_sizes(parser, args)
    _choose_rendezvous(args, max_nodes)
    defaults = {"TELEMETRAIN_PERF_TAG": _entry_stem(args), "TELEMETRAIN_CROSS_RANK": "1", "TELEMETRAIN_WATCHDOG": "1"}
    if int(args.max_restarts) > 0:
        defaults["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    from torch.distributed.elastic.multiprocessing.api import SignalException

    try:
        with environment(defaults=defaults):  # the workers inherit it; a caller in-process gets its own back after
            return _launch(args, max_nodes)
    except SignalException as exc:  # Ctrl-C or a kill: torchelastic has stopped the workers; no traceback
        name = process_hooks.signal_name(int(exc.sigval))
        print(f"telemetrain launch: stopped by {name}; the workers were stopped, the run store has the job so far",
              file=sys.stderr)
        return 128 + int(exc.sigval)


def _check_sizes(parser: argparse.ArgumentParser, args: Any) -> int:
    """--nnodes and --nproc-per-node as torchrun reads them, a usage error naming the flag where torchrun would
    raise a traceback (a ValueError, or a bare AssertionError for 0), and a script that is not there; the maximum
    number of nodes."""
    from torch.distributed import run as torchrun

    try:
        min_nodes, max_nodes = torchrun.parse_min_max_nnodes(args.nnodes)
    except (ValueError, RuntimeError):
        parser.error(f"argument --nnodes: expected N or MIN:MAX, got {args.nnodes!r}")
    if not 0 < min_nodes <= max_nodes:
        parser.error(f"argument --nnodes: expected 0 < MIN <= MAX, got {args.nnodes!r}")
    try:
        nproc = torchrun.determine_local_world_size(args.nproc_per_node)
    except ValueError as exc:
        parser.error(f"argument --nproc-per-node: {exc}")
    if nproc < 1:
        parser.error(f"argument --nproc-per-node: expected a number >= 1, or auto, cpu, gpu, got {nproc}")
    if not args.module and not args.no_python and not os.path.isfile(args.training_script):
        # else each worker's python says it, then torchrun's failure banner: 20 lines, and a failed job in the store
        parser.error(f"argument training_script: no such file: {args.training_script!r}")
    return int(max_nodes)


class OomKills:
    """The OOM kills of the agent's memory cgroup (its workers' too: they inherit it), counted since it last looked.
    A worker killed by the cgroup's OOM killer dies with its sampler, so its own records rarely show the kill; the
    agent outlives it. Without a memory limit (no cgroup that binds) or a readable counter: None."""

    def __init__(self) -> None:
        try:
            from ..system.cgroup_memory import find_cgroup_memory, oom_kill_count

            self.cgroup = find_cgroup_memory()
            self._last = oom_kill_count(self.cgroup) if self.cgroup is not None else None
        except Exception:  # noqa: BLE001 - telemetry never breaks the launch: no count
            self.cgroup, self._last = None, None

    def since_last(self) -> int | None:
        if self.cgroup is None or self._last is None:
            return None
        from ..system.cgroup_memory import oom_kill_count

        now = oom_kill_count(self.cgroup)
        if now is None:
            return None
        kills, self._last = (now - self._last if now >= self._last else now), now  # (below: a new cgroup)
        return kills


def _record_failures(telemetry: Telemetry, failures: Mapping[int, Any], oom: OomKills | None = None) -> None:
    """One ``worker_failed`` event per failed worker (global rank -> torchelastic's ``ProcessFailure``), marking the
    one torchelastic names the root cause: the earliest timestamp, the first found on a tie, as
    ``ChildFailedError.get_first_failure`` picks it (``analysis.findings.worker_exits`` reads them: the cause, then the
    rest). A worker killed by SIGKILL also gets ``oom_kills`` (the agent's memory cgroup's OOM kills since it last
    looked: at the launch, or at the previous attempt's failures) and ``cgroup`` (its directory), where readable."""
    try:
        first: int | None = min(failures, key=lambda r: failures[r].timestamp)
    except Exception:  # noqa: BLE001 - an explanation, never a reason to lose the failures themselves
        first = None
    killed = oom is not None and any(f.exitcode == -signal.SIGKILL for f in failures.values())
    kills = oom.since_last() if killed and oom is not None else None
    for global_rank, failure in sorted(failures.items()):
        attributes = {
            "rank": global_rank, "local_rank": failure.local_rank, "exitcode": failure.exitcode,
            "pid": failure.pid, "message": str(failure.message)[:2000], "error_file": str(failure.error_file),
            "first_failure": global_rank == first, "timestamp": failure.timestamp,
        }
        if kills is not None and oom is not None and oom.cgroup is not None and failure.exitcode == -signal.SIGKILL:
            attributes.update(oom_kills=kills, cgroup=oom.cgroup.directory)
        telemetry.event("worker_failed", attributes, group=GROUP, severity="error")


@contextlib.contextmanager
def _restarted_attempt_failures(telemetry: Telemetry, oom: OomKills | None = None) -> Iterator[None]:
    """While the agent runs: the failed workers of each attempt the agent restarts from, as that attempt's
    ``worker_failed`` events (torchelastic only logs them; the last attempt's come with its ``ChildFailedError``).
    The agent's monitor call is wrapped, in this process only, while the job runs; where torch has no such method the
    job runs as it would, without these events."""
    from torch.distributed.elastic.agent.server.api import WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    original = getattr(LocalElasticAgent, "_monitor_workers", None)
    if original is None:
        yield
        return
    failed = 0

    def monitor(agent: Any, worker_group: Any) -> Any:
        nonlocal failed
        result = original(agent, worker_group)
        try:  # before the agent's metrics move its records to the next attempt: this attempt's folder
            if result.state in (WorkerState.FAILED, WorkerState.UNHEALTHY) and result.failures and \
                    getattr(agent, "_remaining_restarts", 0) > 0:
                _record_failures(telemetry, result.failures, oom)
        except Exception as exc:  # noqa: BLE001 - telemetry never breaks the job
            failed += 1
            if failed == 1:
                warn_safely(f"telemetrain launch: recording a restarted attempt's failures failed ({exc!r})")
        return result

    LocalElasticAgent._monitor_workers = monitor  # type: ignore[method-assign]
    try:
        yield
    finally:
        LocalElasticAgent._monitor_workers = original  # type: ignore[method-assign]


def _ended_by(exc: BaseException) -> tuple[str, int, dict[str, str]]:
    """``launch_end``'s outcome, exit status and ``error`` (and ``signal``) for an exception that stopped the agent.
    torchelastic's handler turns a SIGTERM/SIGINT/SIGHUP/SIGQUIT into its ``SignalException``: the launcher exits
    128 + the signal (``main``), and the error ends "the process was stopped by SIGTERM", as ``describe_end`` says
    for a worker's spans, so the readers call it killed (interrupted for SIGINT), not a crash."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    if isinstance(exc, SignalException):
        name = process_hooks.signal_name(int(exc.sigval))
        return ("interrupted" if exc.sigval == signal.SIGINT else "killed", 128 + int(exc.sigval),
                {"signal": name, "error": f"{describe(exc)}; the process was stopped by {name}"})
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", 128 + signal.SIGINT, {"error": describe(exc)}
    return type(exc).__name__, 1, {"error": describe_end(exc)}


def _launch(args: Any, max_nodes: int) -> int:
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from ..integrations.torchelastic import install

    # the job as the workers will see it: torchrun's placeholder "none" becomes none-<agent pid> for them
    job_env = args.rdzv_id if args.rdzv_id != "none" else f"none-{os.getpid()}"
    nproc = torchrun.determine_local_world_size(args.nproc_per_node)
    config = {
        "launcher": "telemetrain launch",
        "entrypoint": (["-m"] if args.module else []) + [str(args.training_script), *args.training_script_args],
        "nnodes": str(args.nnodes),
        "nproc_per_node": nproc,
        "max_restarts": int(args.max_restarts),
        "rdzv_backend": str(args.rdzv_backend),
        "rdzv_id": str(args.rdzv_id),
        "monitor_interval": float(args.monitor_interval),
        "share_rdzv_tcp_store": os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "0") != "1",
    }
    telemetry = _agent_telemetry(args, job_env, nproc * max_nodes)
    fixed_run_id = bool(os.environ.get("TELEMETRAIN_RUN_ID"))
    follower = AttemptFollower(telemetry, None if fixed_run_id else telemetry.identity.session_tag)
    bridge = install(telemetry, rendezvous=True, on_metric=follower.on_metric)
    if args.event_log_handler == "null":
        args.event_log_handler = "telemetrain"
    watcher = None
    if os.environ.get("TELEMETRAIN_WATCHDOG", "").strip().lower() not in ("", "0", "off", "false", "no"):
        from .stall_view import StallWatcher

        node = int(args.node_rank)
        watcher = StallWatcher(telemetry, nproc * max_nodes,
                               local_ranks=frozenset(range(node * nproc, (node + 1) * nproc))).start()
    started = time.monotonic()
    telemetry.event("launch_start", config, group=GROUP)
    telemetry.event("attempt_start", {"attempt": 0, "reason": "start", "remaining_restarts": int(args.max_restarts)},
                    group=GROUP)
    outcome, status = "failed", 1
    ended: dict[str, str] = {}  # what stopped the agent, when an exception did (_ended_by)
    oom = OomKills()
    try:
        with _restarted_attempt_failures(telemetry, oom):
            torchrun.run(args)  # type: ignore[no-untyped-call]
        outcome, status = "succeeded", 0
    except ChildFailedError as exc:
        _record_failures(telemetry, exc.failures, oom)
        print(exc.format_msg(), file=sys.stderr)  # type: ignore[no-untyped-call]
    except BaseException as exc:  # a signal (torchelastic's SignalException), an interrupt: recorded, then re-raised
        outcome, status, ended = _ended_by(exc)
        raise
    finally:
        if watcher is not None:
            watcher.close()  # the evidence written as the job ended, and the stall event, before launch_end
        telemetry.event("launch_end", {"outcome": outcome, "exitcode": status, "attempts": follower.attempt + 1,
                                       "seconds": time.monotonic() - started, **ended}, group=GROUP,
                        severity="info" if status == 0 else "error")
        bridge.uninstall()
        telemetry.close()
    return status
