#!/usr/bin/env python3
"""What recent changes on the step's path cost, each against the same call without them, in one process:

  collectives  ``telemetrain.distributed.collectives.all_reduce(t)`` against ``torch.distributed.all_reduce(t)`` on a
               one-rank gloo group (a 1 KiB float32 tensor): the default group, and a ``new_group`` (each collective
               is numbered in its own group: a dict lookup by the group, a weak reference checked); and ours on a
               ``new_group`` against ours on the default group. Wall time of the calling thread (a blocking gloo call
               waits for gloo's thread), the peers method's paired repeats (``_method.py``): the ratio is the median
               of the per-pair ratios. And ``CommMonitor.begin`` + ``end`` called directly (what the instrumentation
               adds, without gloo's thread handoffs that make the rows above noisy), a ``new_group`` against the
               default group
  signals      one training iteration (``TrainingRecorder.on_training_single_iteration_start(); _end()``, run store
               attached) in three states of the process's SIGTERM/SIGINT handlers, alternated block by block: ours
               not installed (the interpreter's), ours installed (``process_hooks``), ours installed with a program's
               handler set after ours by ``signal.signal`` (chained behind ours, ``process_hooks._chain_signal``).
               The step never calls into the signal module, so the three should be the same within noise; the
               calling thread's CPU time per iteration, median of the per-pair ratios. Also ``signal.signal`` and
               ``signal.getsignal`` once wrapped, against the interpreter's own (set-up calls, information)

Point-to-point (gloo's ``isend``/``irecv`` timed until waited) needs two ranks and is not measured here.
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import tempfile
from collections.abc import Callable
from itertools import repeat
from time import perf_counter_ns, thread_time_ns
from typing import Any

import _method as m

DISTS = ("torch", "telemetrain")
_BLOCK = """
def timed(n, _cpu=_cpu, _repeat=_repeat):
    c0 = _cpu()
    for _ in _repeat(None, n):
        s(); e()
    return _cpu() - c0
"""


def section_collectives() -> None:
    import torch
    import torch.distributed as dist

    import telemetrain
    from telemetrain.distributed import collectives as tdist
    from telemetrain.distributed.comm import comm_monitor

    t = telemetrain.Telemetry(store=False)
    ours = tdist.using(t)
    group = dist.new_group([0])
    x = torch.ones(256)
    names = {"dist": dist, "ours": ours, "x": x, "g": group}
    bare = m.record_with_peer(m.new_row("torch", "dist.all_reduce(x) (default group)",
                                        *m.measure("dist.all_reduce(x)", names, warm=200)), None)
    m.paired("telemetrain", "tdist.all_reduce(x) (default group)", "ours.all_reduce(x)", names, bare,
             "dist.all_reduce(x)", names)
    bare_g = m.record_with_peer(m.new_row("torch", "dist.all_reduce(x, group=g) (a new_group)",
                                          *m.measure("dist.all_reduce(x, group=g)", names, warm=200)), None)
    m.paired("telemetrain", "tdist.all_reduce(x, group=g) (a new_group)", "ours.all_reduce(x, group=g)", names,
             bare_g, "dist.all_reduce(x, group=g)", names)
    mon = comm_monitor(t)
    names.update(mon=mon, n=x.numel() * 4)
    direct = m.record_with_peer(m.new_row("telemetrain", "CommMonitor.begin + end, default group", *m.measure(
        "mon.end(mon.begin('all_reduce', n))", names)), None)
    m.paired("telemetrain", "CommMonitor.begin + end, a new_group", "mon.end(mon.begin('all_reduce', n, group=g))",
             names, direct, "mon.end(mon.begin('all_reduce', n))", names)
    ours_default = m.row_of("telemetrain", "tdist.all_reduce(x) (default group)")
    assert ours_default is not None
    m.paired("telemetrain", "tdist.all_reduce(x, group=g) against tdist on the default group",
             "ours.all_reduce(x, group=g)", names, ours_default, "ours.all_reduce(x)", names)
    t.close()


def _program_handler(signum: int, frame: Any) -> None:  # set by "the program"; never called here
    raise SystemExit(128 + signum)


def section_signals(tmpdir: str) -> None:
    from telemetrain import Telemetry, process_hooks
    from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

    t = Telemetry(store=os.path.join(tmpdir, "signals"))
    config = TrainingTelemetryConfig(global_batch_size_or_fn=8, log_every_n_train_iterations=50,
                                     flops_per_sample_or_fn=1e9, device_name="cpu")
    rec = TrainingRecorder(config, telemetry=t)
    rec.on_app_start()
    rec.on_train_start(0)  # the first record routed installs ours
    if process_hooks._real_getsignal(signal.SIGTERM) is not process_hooks._on_signal:
        raise RuntimeError("process_hooks did not install its SIGTERM handler (not the main thread?)")
    scope: dict[str, Any] = {"s": rec.on_training_single_iteration_start, "e": rec.on_training_single_iteration_end,
                             "_cpu": thread_time_ns, "_repeat": repeat}
    exec(compile(_BLOCK, "<bench signals block>", "exec"), scope)
    timed: Callable[[int], int] = scope["timed"]
    interpreter = {s: process_hooks._base[s] for s in (signal.SIGTERM, signal.SIGINT)}  # what ours replaced

    def state(which: str) -> None:
        for s, before in interpreter.items():
            if which == "none":
                process_hooks._real_signal(s, before)
            else:
                process_hooks._real_signal(s, process_hooks._on_signal)
                signal.signal(s, _program_handler if which == "chained" else before)  # through _chain_signal
    states = ("none", "ours", "chained")
    timed(20_000)
    n = 20_000 if m.ARGS.quick else 100_000
    per: dict[str, list[float]] = {s: [] for s in states}
    for k in range(2 * m.ARGS.repeats):
        order = states if k % 2 == 0 else states[::-1]
        for which in order:
            state(which)
            per[which].append(timed(n) / n)
    state("ours")
    assert signal.getsignal(signal.SIGTERM) is interpreter[signal.SIGTERM]
    labels = {"none": "iteration, no process_hooks signal handlers (the interpreter's)",
              "ours": "iteration, process_hooks' handlers installed",
              "chained": "iteration, a program's handler chained behind ours (signal.signal after ours)"}
    base = m.record_with_peer(m.new_row("telemetrain", labels["none"], per["none"], n), None)
    for which in ("ours", "chained"):
        row = m.record_with_peer(m.new_row("telemetrain", labels[which], per[which], n), base)
        row["pair_ratios"] = [a / b for a, b in zip(per[which], per["none"], strict=True)]
        row["ratio"] = statistics.median(row["pair_ratios"])
        m.progress(f"{'':<24} paired ratio {row['ratio']:.4f}")
    rec.on_train_end()
    rec.on_app_end()
    t.close()
    wrapped_names = {"signal": signal, "h": _program_handler, "T": signal.SIGTERM, "real": process_hooks._real_signal,
                     "realget": process_hooks._real_getsignal}
    real_set = m.record_with_peer(m.new_row("python", "signal.signal(SIGTERM, h) (the interpreter's)", *m.measure(
        "real(T, h)", wrapped_names)), None)
    state("ours")
    m.record_with_peer(m.new_row("telemetrain", "signal.signal(SIGTERM, h) once ours are installed (chained)",
                                 *m.measure("signal.signal(T, h)", wrapped_names)), real_set)
    real_get = m.record_with_peer(m.new_row("python", "signal.getsignal(SIGTERM) (the interpreter's)", *m.measure(
        "realget(T)", wrapped_names)), None)
    m.record_with_peer(m.new_row("telemetrain", "signal.getsignal(SIGTERM) once ours are installed",
                                 *m.measure("signal.getsignal(T)", wrapped_names)), real_get)
    signal.signal(signal.SIGTERM, interpreter[signal.SIGTERM])


def main(argv: list[str] | None = None) -> int:
    ap = m.parser(__doc__, "a short smoke run (~10 s)")
    ap.add_argument("--only", help="comma-separated sections: collectives, signals")
    args = m.parse_args(ap, argv)
    if args.quick:
        args.repeats, args.target_ms, args.warmup_s = 3, 20.0, 0.1
    tmpdir = tempfile.mkdtemp(prefix="bench_comm_")
    load_before = m.loadavg()
    t0 = perf_counter_ns()
    m.spin(args.warmup_s)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29_500 + os.getpid() % 1000))
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        failed = m.run_sections([("collectives", section_collectives),
                                 ("signals", lambda: section_signals(tmpdir))], lambda name: True, args.only)
    finally:
        dist.destroy_process_group()
    load_after = m.loadavg()
    m.print_header(DISTS, load_before, load_after)
    print(f"method: bench/_method.py, {args.repeats} repeats (pairs: 2x); whole run "
          f"{(perf_counter_ns() - t0) / 1e9:.0f} s")
    table = m.render_table((("ratio", "---:"),), lambda r: ("" if r.get("ratio") is None else f"{r['ratio']:.3f}x",))
    m.print_report(table, [], args.json, DISTS, (load_before, load_after), args, {})
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
