"""Subprocess scenarios for ``test_faults.py``: each runs in a fresh interpreter, so signals, forks and exits are real
and the test process stays clean.

Usage: ``python _proc_helpers.py <scenario> <store root> [args...]``. The identity comes from the environment
(``TELEMETRAIN_RUN_ID``, ``TELEMETRAIN_SESSION_TAG``, ``RANK``, ``WORLD_SIZE``), which the test sets.

Every scenario stops on its own after ``SELF_DESTRUCT_S`` so a broken test never leaves a process behind.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback

from telemetrain import Telemetry

GROUP = "faults"
SELF_DESTRUCT_S = 90.0
CHAINED_EXIT_CODE = 42


def _stream(root: str, ack_every: int, flush_interval: float, chained_marker: str | None) -> None:
    """Emit metric ``seq`` = 0, 1, 2, ... forever; after every ``ack_every`` records print how many were emitted.

    With ``chained_marker``, a SIGTERM handler of the program's own is installed *before* telemetrain; it writes the
    number of records emitted so far to the marker file and leaves with ``os._exit`` (so atexit cannot be what
    saves the data: only the flush telemetrain does before chaining to this handler can).
    """
    state = {"n": 0}
    # As in an interactive program: a shell's background job would otherwise start with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if chained_marker is not None:

        def own_handler(signum: int, frame: object) -> None:
            with open(chained_marker + ".tmp", "w") as fh:
                fh.write(str(state["n"]))
            os.rename(chained_marker + ".tmp", chained_marker)
            os._exit(CHAINED_EXIT_CODE)

        signal.signal(signal.SIGTERM, own_handler)

    t = Telemetry(store=root, flush_interval=flush_interval, queue_capacity=2_000_000)
    metric = t.metric
    out = sys.stdout
    deadline = time.monotonic() + SELF_DESTRUCT_S
    i = 0
    while i < 1_500_000:  # far more than any test waits for
        metric("seq", i, GROUP)
        i += 1
        state["n"] = i
        if i % ack_every == 0:
            out.write(f"{i}\n")
            out.flush()
            time.sleep(0.001)  # pace the stream: durability is under test here, not throughput
            if time.monotonic() > deadline:
                break
    os._exit(3)  # never reached in a passing test: the parent signals us long before


def _fork_storm(root: str, n_children: int) -> None:
    """A thread emits ``parent`` = 0, 1, ... while the main thread forks ``n_children`` times; each child emits
    ``child`` = 0..4, flushes and leaves with ``os._exit``. Prints a JSON summary on stdout."""
    t = Telemetry(store=root, flush_interval=0.005, queue_capacity=2_000_000)
    t.metric("parent_start", 1, GROUP)  # installs the process hooks (main thread) and starts the writer thread
    stop = threading.Event()
    emitted = {"n": 0}

    def emit() -> None:
        i = 0
        metric = t.metric
        while not stop.is_set():
            metric("parent", i, GROUP)
            i += 1
            if i % 50 == 0:
                time.sleep(0.0002)
        emitted["n"] = i

    thread = threading.Thread(target=emit, name="emitter", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30.0
    while not t.health()["sinks"][0]["delivered"] and time.monotonic() < deadline:
        time.sleep(0.001)  # the writer thread is busy before the first fork
    pids = []
    for _ in range(n_children):
        pid = os.fork()
        if pid == 0:  # the child
            code = 4
            try:
                for j in range(5):
                    t.metric("child", j, GROUP)
                code = 0 if t.flush(20.0) else 5
            except BaseException:  # noqa: BLE001 - report; never return into the parent's code
                traceback.print_exc()
            finally:
                os._exit(code)
        pids.append(pid)
    deadline = time.monotonic() + 60.0  # generous: only a deadlock gets near it
    codes: dict[int, object] = {}
    pending = set(pids)
    while pending and time.monotonic() < deadline:
        for pid in list(pending):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                codes[pid] = os.waitstatus_to_exitcode(status)
                pending.discard(pid)
        if pending:
            time.sleep(0.005)
    for pid in pending:  # deadlocked children fail the test instead of hanging it
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        codes[pid] = "hung"
    stop.set()
    thread.join(30.0)
    health = t.health()
    closed = t.close(30.0)
    summary = {
        "parent_pid": os.getpid(),
        "children": pids,
        "codes": {str(k): v for k, v in codes.items()},
        "parent_emitted": emitted["n"],
        "emitter_alive": thread.is_alive(),
        "dropped": health["dropped"],
        "closed": closed,
    }
    print(json.dumps(summary), flush=True)


def _mp_workers(root: str, variant: str, n_workers: int) -> None:
    """multiprocessing (fork) workers emit without flushing and return; ``Process`` leaves them with ``os._exit``.

    ``variant``: ``parent_first`` -- the parent emitted before starting the workers (hooks installed in the parent);
    ``child_first`` -- the parent built its ``Telemetry`` but emitted nothing yet (a DataLoader's workers start at
    ``iter(loader)``, before the first training metric), so the worker's first record is the process's first.
    The flush interval is long: only an exit-time flush can put the workers' records on disk.
    """
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    t = Telemetry(store=root, flush_interval=120.0)
    if variant == "parent_first":
        t.metric("parent", 1, GROUP)
    elif variant != "child_first":
        raise SystemExit(f"unknown variant {variant!r}")

    def work(k: int) -> None:
        for j in range(100):
            t.metric("worker", k * 1000 + j, GROUP)

    procs = [ctx.Process(target=work, args=(k,)) for k in range(n_workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30.0)
    summary = {"pids": [p.pid for p in procs], "exitcodes": [p.exitcode for p in procs]}
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5.0)
    t.close(10.0)
    print(json.dumps(summary), flush=True)


def _writer(root: str, n: int, go_file: str) -> None:
    """Wait for ``go_file`` (so that all writers run at once), emit ``seq`` = 0..n-1, close."""
    t = Telemetry(store=root, flush_interval=0.01)
    deadline = time.monotonic() + 30.0
    while not os.path.exists(go_file):
        if time.monotonic() > deadline:
            raise SystemExit("no go signal")
        time.sleep(0.002)
    metric = t.metric
    for i in range(n):
        metric("seq", i, GROUP)
        if i % 1000 == 999:
            time.sleep(0.0005)  # let the writers interleave
    ok = t.close(30.0)
    print(json.dumps({"pid": os.getpid(), "closed": ok, "dropped": t.health()["dropped"]}), flush=True)


def _disk_full(root: str) -> None:
    """The run-store file hits a size limit (as on a full disk: writes fail with EFBIG/ENOSPC), then space returns.

    Emits ``seq`` 0..199 with room for only a few dozen lines, then lifts the limit and emits 200..299. Prints a JSON
    summary: nothing may have raised into this loop."""
    import resource

    from telemetrain import FailurePolicy

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else exceeding RLIMIT_FSIZE kills the process
    policy = FailurePolicy(max_consecutive=2, backoff_s=0.05, backoff_max_s=0.05)
    t = Telemetry(store=root, flush_interval=0.01, failure_policy=policy)
    t.metric("seq", 0, GROUP)
    assert t.flush()
    size = os.path.getsize(t.store.path)  # type: ignore[union-attr,arg-type]
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 3000, resource.RLIM_INFINITY))
    for i in range(1, 200):
        t.metric("seq", i, GROUP)
        if i % 20 == 0:
            t.flush()  # several batches: the first one hits the limit part-way, later ones fail outright
    t.flush()
    failed_while_full = t.health()["failed"]
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    time.sleep(0.3)  # past the suspension backoff
    for i in range(200, 300):
        t.metric("seq", i, GROUP)
    assert t.flush()
    health = t.health()
    t.close()
    print(json.dumps({"failed_while_full": failed_while_full, "health": health}))


def main(argv: list[str]) -> None:
    # A watchdog in case the parent test dies: never outlive it by much.
    watchdog = threading.Timer(SELF_DESTRUCT_S + 30.0, lambda: os._exit(99))
    watchdog.daemon = True
    watchdog.start()
    scenario, root, *args = argv
    if scenario == "stream":
        ack_every, flush_interval = int(args[0]), float(args[1])
        _stream(root, ack_every, flush_interval, args[2] if len(args) > 2 else None)
    elif scenario == "fork_storm":
        _fork_storm(root, int(args[0]))
    elif scenario == "mp_workers":
        _mp_workers(root, args[0], int(args[1]))
    elif scenario == "disk_full":
        _disk_full(root)
    elif scenario == "writer":
        _writer(root, int(args[0]), args[1])
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")


if __name__ == "__main__":
    main(sys.argv[1:])


# -- stats (test_stats.py) --------------------------------------------------------------------------------------------
# Run as ``python -c "import _proc_helpers as h; h.stat_partial_window(root, emit_first, then)"`` (``main`` above
# is left as it is).

_KEEP: list[object] = []


def stat_partial_window(root: str, emit_first: str, then: str) -> None:
    """A stat with a one-hour time window gets samples 0..9, so its window is still open when the process ends.

    ``emit_first``: ``"metric"`` emits one metric record before the samples, ``"none"`` records nothing but the stat
    (a program that only uses stats). ``then``: ``"exit"`` falls off the end (a normal exit, the stat still alive as
    a script's globals are); ``"sleep"`` sleeps until the parent sends SIGTERM. Prints ``ready`` when the samples
    are in."""
    from telemetrain.stats import Stat

    t = Telemetry(store=root)
    stat = Stat("partial", ["count", "sum"], window=3600, telemetry=t)
    if emit_first == "metric":
        t.metric("started", 1, GROUP)
    for i in range(10):
        stat.add(i)
    _KEEP.extend((t, stat))  # alive until the interpreter exits, as a script's module globals are
    print("ready", flush=True)
    if then == "sleep":
        time.sleep(SELF_DESTRUCT_S)
        os._exit(3)  # never reached in a passing test: the parent signals us long before


# -- spans and training (test_spans.py, test_training.py) ---------------------------------------------------------
# Run the same way: ``python -c "import _proc_helpers as h; h.spans_open_at_exit(root, then)"``.


def spans_open_at_exit(root: str, then: str) -> None:
    """Spans still open when the process ends: ``closed_before`` (ended normally), ``started_open``
    (``Tracer.start``, never ended). ``then``: ``"exit"`` prints ``ready`` and falls off the end (a normal exit with
    the started span open); ``"sleep"`` also opens ``outer`` > ``inner`` with ``with`` blocks, prints ``ready`` inside
    them and sleeps until the parent sends SIGTERM."""
    from telemetrain.spans import tracer

    t = Telemetry(store=root)
    tr = tracer(t)
    with tr.span("closed_before"):
        pass
    started = tr.start("started_open", make_current=False)
    _KEEP.extend((t, started))
    if then == "exit":
        print("ready", flush=True)
        return
    with tr.span("outer"), tr.span("inner"):
        print("ready", flush=True)
        time.sleep(SELF_DESTRUCT_S)
        os._exit(3)  # never reached in a passing test: the parent signals us long before


def training_until_sigterm(root: str, iterations: int, every: int) -> None:
    """A training loop on the default recorder (context managers): ``iterations`` iterations complete, then the next
    one starts and blocks (printing ``ready``) until the parent sends SIGTERM. ``every``: log_every_n_train_iterations.
    """
    import telemetrain
    from telemetrain import training

    t = Telemetry(store=root)
    telemetrain.set_telemetry(t)
    training.configure(training.TrainingTelemetryConfig(global_batch_size_or_fn=4, log_every_n_train_iterations=every))
    with training.application(), training.training_loop(train_iterations_start=0):
        for _ in range(iterations):
            with training.training_iteration():
                time.sleep(0.001)
        with training.training_iteration():
            print("ready", flush=True)
            time.sleep(SELF_DESTRUCT_S)
            os._exit(3)  # never reached in a passing test
