#!/usr/bin/env python3
"""The per-step cost of ``telemetrain.integrations.lightning.TelemetrainCallback`` on a Lightning ``Trainer``, against
the plain-loop case (the recorder's iteration callbacks a hand-written loop calls), against the same Trainer without
the callback, and a hand-written PyTorch loop with and without telemetrain.

Sections (ns per optimizer step, median and best of ``--repeats``; every row names the row it is compared with):

  baseline  empty function call
  hooks     the plain-loop case: ``TrainingRecorder.on_training_single_iteration_start(); _end()`` (a loop open,
            ``log_every_n_train_iterations=50``, run store at its normal flush interval); the callback's hooks of one
            optimizer step with gradient accumulation 2 called directly (``on_train_batch_start``,
            ``on_train_batch_end`` twice, the global step advancing at the second micro-batch: what the callback adds
            to a step; the trainer argument is a stand-in holding ``global_step``, all these hooks read of it), with
            the plain-loop row as peer
  lightning a tiny Lightning fit (an MLP ``16 -> --width -> 1``, micro-batch ``--batch``, accumulation 2, CPU,
            ``torch.set_num_threads(1)``, no validation, checkpointing, logger or progress bar), ``--steps`` optimizer
            steps per run: rounds of three runs -- plain Trainer (P), the Trainer with the callback (T), plain again
            (Q) -- in rotating order; a run's time is its training loop (a timestamp callback listed ahead of the
            telemetrain callback, at ``on_train_start`` and ``on_train_end``), per optimizer step, in wall time and in
            process CPU time (all threads). Ratio: the median over rounds of T / mean(P, Q); the control Q/P is the
            method's noise floor. Each T run has a fresh Telemetry whose writer is started before it
  loop      the same model and data in a hand-written loop (``examples/plain_loop.py``'s shape: zero_grad, forward,
            backward, step), bare (P, Q) and inside ``training.training_iteration()`` with a training loop and
            application open (T), the same rounds and ratios

Checks: 1 the Lightning run's ratio in process CPU time <= 1.01 (+ the control's noise; wall time beside); 2 the
callback's direct per-step cost (hooks row) <= 1% of a plain Lightning step; 3 the hand-written loop's ratio in
process CPU time <= 1.02 (+ noise); 4 every telemetry run wrote its lifecycle (one training loop, ok, every step
counted, no error events, no failures in the callback).

Usage:
    python bench/bench_lightning.py            # full run (~2 min), markdown on stdout, progress on stderr
    python bench/bench_lightning.py --quick    # short smoke run (< 40 s)
    python bench/bench_lightning.py --json out.json
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import statistics
import sys
import tempfile
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from time import perf_counter_ns, process_time_ns
from typing import Any

import _method
from _method import NOTES, measure, new_row, progress

warnings.filterwarnings("ignore")

ARGS: Any
EXTRA: dict[str, Any] = {}
DISTS = ("telemetrain", "torch", "lightning")
ACCUM = 2

_record = _method.record_with_peer


def _row(lib: str, op: str, samples: list[float], n: object, peer: dict | None = None) -> dict:
    return _record(new_row(lib, op, samples, n), peer)


def bench(lib: str, op: str, stmt: str, names: dict, *, peer: dict | None = None) -> dict:
    samples, n = measure(stmt, names, collect=ARGS.collect)
    return _row(lib, op, samples, n, peer)


# -- the tiny model -----------------------------------------------------------------------------------------------


def _torch() -> Any:
    import torch

    torch.set_num_threads(1)
    return torch


def _data(torch: Any) -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(0)
    n = ARGS.batch * ACCUM * ARGS.steps
    return torch.randn(n, 16, generator=g), torch.randn(n, 1, generator=g)


def _mlp(torch: Any) -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, ARGS.width), torch.nn.ReLU(), torch.nn.Linear(ARGS.width, 1))


def _lightning_parts() -> Any:
    import lightning.pytorch as pl

    torch = _torch()
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    x, y = _data(torch)

    class Regressor(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _mlp(torch)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Clock(pl.Callback):
        """The training loop's time: on_train_start to on_train_end (listed ahead of the telemetrain callback)."""

        def __init__(self) -> None:
            self.begin = self.end = self.cpu_begin = self.cpu_end = 0

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self.cpu_begin = process_time_ns()
            self.begin = perf_counter_ns()

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            self.end = perf_counter_ns()
            self.cpu_end = process_time_ns()

    def loader() -> Any:
        dataset = torch.utils.data.TensorDataset(x, y)
        return torch.utils.data.DataLoader(dataset, batch_size=ARGS.batch)

    def trainer(callbacks: list) -> Any:
        return pl.Trainer(accelerator="cpu", devices=1, max_steps=ARGS.steps, accumulate_grad_batches=ACCUM,
                          logger=False, enable_checkpointing=False, enable_progress_bar=False,
                          enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
                          log_every_n_steps=50, callbacks=callbacks)

    return Regressor, Clock, loader, trainer


# -- sections -----------------------------------------------------------------------------------------------------


def section_baseline() -> None:
    def f() -> None:
        pass

    bench("baseline", "empty function call `f()`", "f()", {"f": f})


def section_hooks(tmpdir: str) -> None:
    from telemetrain import Telemetry
    from telemetrain.integrations.lightning import TelemetrainCallback
    from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

    config = TrainingTelemetryConfig(global_batch_size_or_fn=ARGS.batch * ACCUM, log_every_n_train_iterations=50)
    t = Telemetry(store=os.path.join(tmpdir, "plain"))
    r = TrainingRecorder(config, telemetry=t)
    r.on_app_start()
    r.on_train_start(0)
    plain = bench("plain loop", "1 step: recorder.on_training_single_iteration_start(); _end() (the plain-loop case)",
                  "start(); end()", {"start": r.on_training_single_iteration_start,
                                     "end": r.on_training_single_iteration_end})
    r.on_train_end()
    r.on_app_end()
    t.close()

    t = Telemetry(store=os.path.join(tmpdir, "hooks"))
    cb = TelemetrainCallback(config, recorder=TrainingRecorder(telemetry=t))
    trainer = types.SimpleNamespace(global_step=0)
    cb.recorder.set_training_telemetry_config(config)
    cb.recorder.on_app_start()
    cb.recorder.on_train_start(0)
    stmt = "bs(tr, m, b, 0); be(tr, m, o, b, 0); bs(tr, m, b, 1); tr.global_step += 1; be(tr, m, o, b, 1)"
    names = {"tr": trainer, "m": None, "b": None, "o": None, "bs": cb.on_train_batch_start,
             "be": cb.on_train_batch_end}
    direct = bench("lightning callback", "1 step (accumulation 2): on_train_batch_start/_end x2, called directly",
                   stmt, names, peer=plain)
    EXTRA["direct_ns"] = direct["median_ns"]
    cb.recorder.on_train_end()
    cb.recorder.on_app_end()
    t.close()
    EXTRA["hook_failures"] = cb.failures


def _rounds(label: str, what: str, plain: Callable[[], tuple[int, int]], telemetry: Callable[[int], tuple[int, int]],
            key: str) -> None:
    """Rounds of P (plain), T (telemetry), Q (plain again) in rotating order; rows, ratios and notes under ``key``."""
    plain()  # warm-up: first calls, allocator, file cache
    telemetry(-1)
    orders = (("P", "T", "Q"), ("T", "Q", "P"), ("Q", "P", "T"))
    runs: dict[str, list[int]] = {"P": [], "T": [], "Q": []}
    cpu: dict[str, list[int]] = {"P": [], "T": [], "Q": []}
    ratios, controls, cpu_ratios, cpu_controls = [], [], [], []
    for k in range(ARGS.rounds):
        for variant in orders[k % 3]:
            wall, used = telemetry(k) if variant == "T" else plain()
            runs[variant].append(wall)
            cpu[variant].append(used)
        p, t, q = runs["P"][-1], runs["T"][-1], runs["Q"][-1]
        ratios.append(2 * t / (p + q))
        controls.append(q / p)
        cp, ct, cq = cpu["P"][-1], cpu["T"][-1], cpu["Q"][-1]
        cpu_ratios.append(2 * ct / (cp + cq))
        cpu_controls.append(cq / cp)
        progress(f"{key} round {k + 1}/{ARGS.rounds} ({''.join(orders[k % 3])}): plain {p / 1e9:.3f} s / "
                 f"{q / 1e9:.3f} s, telemetry {t / 1e9:.3f} s: ratio {ratios[-1]:.4f} (CPU time {cpu_ratios[-1]:.4f})")
    steps = ARGS.steps
    p_row = _row(label, f"{what}, no telemetry, ns per optimizer step", [x / steps for x in runs["P"] + runs["Q"]],
                 steps)
    t_row = _row(label, f"{what}, with telemetry, ns per optimizer step", [x / steps for x in runs["T"]], steps, p_row)
    t_row["ratio"], t_row["pair_ratios"] = statistics.median(ratios), ratios
    c_row = _row(label, "control: no telemetry vs no telemetry (Q/P, the same rounds), ns per optimizer step",
                 [x / steps for x in runs["Q"]], steps, p_row)
    c_row["ratio"], c_row["pair_ratios"] = statistics.median(controls), controls
    pc_row = _row(label, f"{what}, no telemetry, process CPU ns per optimizer step",
                  [x / steps for x in cpu["P"] + cpu["Q"]], steps)
    tc_row = _row(label, f"{what}, with telemetry, process CPU ns per optimizer step", [x / steps for x in cpu["T"]],
                  steps, pc_row)
    tc_row["ratio"], tc_row["pair_ratios"] = statistics.median(cpu_ratios), cpu_ratios
    cc_row = _row(label, "control, process CPU ns per optimizer step (Q/P)", [x / steps for x in cpu["Q"]], steps,
                  pc_row)
    cc_row["ratio"], cc_row["pair_ratios"] = statistics.median(cpu_controls), cpu_controls
    EXTRA[key] = {
        "median_ratio": statistics.median(ratios),
        "median_control": statistics.median(controls),
        "control_abs_dev_median": statistics.median(abs(c - 1.0) for c in controls),
        "median_cpu_ratio": statistics.median(cpu_ratios),
        "median_cpu_control": statistics.median(cpu_controls),
        "cpu_control_abs_dev_median": statistics.median(abs(c - 1.0) for c in cpu_controls),
        "plain_step_ns": p_row["median_ns"],
        "rounds": ARGS.rounds,
    }
    NOTES.append(
        f"{key}: {ARGS.rounds} rounds of plain (P) / telemetry (T) / plain (Q) in rotating order, {steps} optimizer "
        f"steps a run, one warm-up run of each first. Ratio T / mean(P, Q) per round: "
        + ", ".join(f"{r:.4f}" for r in ratios) + "; control Q/P: " + ", ".join(f"{r:.4f}" for r in controls)
        + "; in process CPU time: " + ", ".join(f"{r:.4f}" for r in cpu_ratios) + "; control "
        + ", ".join(f"{r:.4f}" for r in cpu_controls) + "."
    )


def _lifecycle_ok(t: Any, failures: int) -> bool:
    from telemetrain.store import open_run

    t.flush()
    records = open_run(t.run_dir).records()
    loops = [x for x in records if x.kind == "span_end" and x.name == "training_loop"]
    reports = [x.attributes for x in records if x.kind == "event" and x.name == "training_metrics_update"]
    errors = [x for x in records if x.kind == "event" and x.name == "error"]
    return (len(loops) == 1 and loops[0].status == "ok" and bool(reports)
            and reports[-1]["num_iterations"] == ARGS.steps and not errors and failures == 0)


def section_lightning(tmpdir: str) -> None:
    from telemetrain import Telemetry
    from telemetrain.integrations.lightning import TelemetrainCallback

    regressor, clock_cls, loader, trainer = _lightning_parts()
    stores: list[bool] = EXTRA.setdefault("stores", [])

    def fit(callbacks: list) -> None:
        tr = trainer(callbacks)
        model, data = regressor(), loader()
        if ARGS.collect:
            gc.collect()
        tr.fit(model, data)

    def plain() -> tuple[int, int]:
        clock = clock_cls()
        fit([clock])
        return clock.end - clock.begin, clock.cpu_end - clock.cpu_begin

    def telemetry(k: int) -> tuple[int, int]:
        t = Telemetry(store=os.path.join(tmpdir, f"l{k}"))
        t.event("bench.ready", group="bench")  # the store's writer thread started, as in a job already running
        t.flush()
        clock = clock_cls()
        cb = TelemetrainCallback(telemetry=t)
        fit([clock, cb])
        if k >= 0:
            stores.append(_lifecycle_ok(t, cb.failures))
        t.close()
        return clock.end - clock.begin, clock.cpu_end - clock.cpu_begin

    what = f"Lightning fit, MLP 16x{ARGS.width}x1, batch {ARGS.batch} x accumulation {ACCUM}"
    _rounds("lightning", what, plain, telemetry, "lightning")


def section_loop(tmpdir: str) -> None:
    from telemetrain import Telemetry
    from telemetrain.training import TrainingContexts, TrainingRecorder, TrainingTelemetryConfig

    torch = _torch()
    x, y = _data(torch)
    stores: list[bool] = EXTRA.setdefault("stores", [])

    def loop(iteration: Callable[[], Any] | None) -> tuple[int, int]:
        model = _mlp(torch)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        micro = ARGS.batch
        if ARGS.collect:
            gc.collect()
        cpu0, t0 = process_time_ns(), perf_counter_ns()
        for step in range(ARGS.steps):
            cm = iteration() if iteration is not None else None
            if cm is not None:
                cm.__enter__()
            optimizer.zero_grad()
            for k in range(ACCUM):
                i = (step * ACCUM + k) * micro
                loss = torch.nn.functional.mse_loss(model(x[i:i + micro]), y[i:i + micro])
                loss.backward()
            optimizer.step()
            if cm is not None:
                cm.__exit__(None, None, None)
        return perf_counter_ns() - t0, process_time_ns() - cpu0

    def plain() -> tuple[int, int]:
        return loop(None)

    def telemetry(k: int) -> tuple[int, int]:
        t = Telemetry(store=os.path.join(tmpdir, f"p{k}"))
        t.event("bench.ready", group="bench")
        t.flush()
        recorder = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=ARGS.batch * ACCUM,
                                                            log_every_n_train_iterations=50), telemetry=t)
        contexts = TrainingContexts(lambda: recorder)
        with contexts.application(), contexts.training_loop(train_iterations_start=0):
            elapsed = loop(contexts.training_iteration)
        if k >= 0:
            stores.append(_lifecycle_ok(t, 0))
        t.close()
        return elapsed

    what = f"hand-written loop, MLP 16x{ARGS.width}x1, batch {ARGS.batch} x accumulation {ACCUM}"
    _rounds("plain loop", what, plain, telemetry, "loop")


# -- checks -------------------------------------------------------------------------------------------------------


def _ratio_check(cid: str, key: str, limit: float, title: str) -> dict:
    tr = EXTRA.get(key)
    if tr is None:
        return {"id": cid, "status": "SKIP", "title": title, "text": "section not run"}
    ratio, noise = tr["median_cpu_ratio"], tr["cpu_control_abs_dev_median"]
    return {"id": cid, "status": "PASS" if ratio <= limit + noise else "FAIL", "ratio": ratio,
            "wall_ratio": tr["median_ratio"], "title": title,
            "text": f"median over {tr['rounds']} rounds {ratio:.4f}x; control Q/P {tr['median_cpu_control']:.4f}x "
                    f"(median |Q/P - 1| {noise:.2%}); wall time {tr['median_ratio']:.4f}x, control "
                    f"{tr['median_control']:.4f}x (median |Q/P - 1| {tr['control_abs_dev_median']:.2%})"}


def checks() -> list[dict]:
    out = [_ratio_check("1", "lightning", 1.01, "Lightning fit with the callback / without, process CPU time, <= 1.01 "
                                                "(+ the control's noise)")]
    direct, tr = EXTRA.get("direct_ns"), EXTRA.get("lightning")
    if direct is None or tr is None:
        out.append({"id": "2", "status": "SKIP", "title": "direct cost", "text": "hooks or lightning section not run"})
    else:
        fraction = direct / tr["plain_step_ns"]
        out.append({"id": "2", "status": "PASS" if fraction <= 0.01 else "FAIL", "fraction": fraction,
                    "title": "the callback's hooks per step <= 1% of a plain Lightning step",
                    "text": f"{direct / 1e3:.2f} us of {tr['plain_step_ns'] / 1e6:.3f} ms = {fraction:.3%}"})
    out.append(_ratio_check("3", "loop", 1.02, "hand-written loop with the training iteration / without, process CPU "
                                               "time, <= 1.02 (+ the control's noise)"))
    stores = EXTRA.get("stores", [])
    ok = bool(stores) and all(stores) and not EXTRA.get("hook_failures")
    out.append({"id": "4", "status": "PASS" if ok else "FAIL", "title": "every telemetry run wrote its lifecycle",
                "text": f"{sum(stores)}/{len(stores)} runs complete; hook failures {EXTRA.get('hook_failures', 0)}"})
    return out


def render_table() -> str:
    def cells(r: dict) -> list[str]:
        ratio = "" if r.get("ratio") is None else f"{r['ratio']:.3f}x"
        return [ratio, r.get("peer") or ""]

    return _method.render_table([("ratio to peer", "---:"), ("peer", "---")], cells)


def main(argv: list[str] | None = None) -> int:
    global ARGS
    ap = _method.parser(__doc__, "short smoke run (< 40 s)")
    ap.set_defaults(repeats=7, min_n=2_000)
    ap.add_argument("--steps", type=int, default=200, help="optimizer steps per training run")
    ap.add_argument("--rounds", type=int, default=7, help="rounds of three training runs (plain, telemetry, plain)")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--only", help="comma-separated sections to run (hooks, lightning, loop)")
    ARGS = _method.parse_args(ap, argv)
    ARGS.collect = not ARGS.quick
    if ARGS.quick:
        ARGS.repeats, ARGS.steps, ARGS.rounds, ARGS.warmup_s, ARGS.target_ms, ARGS.min_n = 2, 12, 1, 0.1, 20.0, 200

    tmpdir = tempfile.mkdtemp(prefix="bench_lightning_")
    load_before = _method.loadavg()
    t_start = perf_counter_ns()
    _method.spin(ARGS.warmup_s)
    sections = [
        ("baseline", section_baseline),
        ("hooks", lambda: section_hooks(tmpdir)),
        ("lightning", lambda: section_lightning(tmpdir)),
        ("loop", lambda: section_loop(tmpdir)),
    ]
    try:
        failed = _method.run_sections(sections, lambda name: True, ARGS.only)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    load_after = _method.loadavg()
    results_checks = checks()
    failed = failed or results_checks[-1]["status"] == "FAIL"

    _method.print_header(DISTS, load_before, load_after)
    print(f"method: the peers method (bench/_method.py) for the hooks rows ({ARGS.repeats} repeats); training runs in "
          f"rounds (see the notes); whole run {(perf_counter_ns() - t_start) / 1e9:.0f} s")
    _method.print_report(render_table(), results_checks, ARGS.json, DISTS, (load_before, load_after), ARGS, EXTRA)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing
    sys.exit(main())
