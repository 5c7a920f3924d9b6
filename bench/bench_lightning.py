#!/usr/bin/env python3
"""The per-step cost of ``telemetrain.integrations.lightning.TelemetrainCallback`` on a Lightning ``Trainer``, against
the plain-loop case (the recorder's iteration callbacks a hand-written loop calls), against the same Trainer without
the callback, and a hand-written PyTorch loop with and without telemetrain.

Sections (ns per optimizer step, median and best of ``--repeats``; every row names the row it is compared with):

  baseline  empty function call
  hooks     the plain-loop case: ``TrainingRecorder.on_training_single_iteration_start(); _end()`` (a loop open,
            ``log_every_n_train_iterations`` = ``--log-every``, run store at its normal flush interval); the
            callback's hooks of one optimizer step with gradient accumulation 2 called directly
            (``on_train_batch_start``, ``on_train_batch_end`` twice, the global step advancing at the second
            micro-batch: what the callback adds to a step; the trainer argument is a stand-in holding ``global_step``,
            all these hooks read of it), with the plain-loop row as peer
  lightning a tiny Lightning fit (an MLP ``16 -> --width -> 1``, micro-batch ``--batch``, accumulation 2, CPU,
            ``torch.set_num_threads(1)``, no validation, checkpointing, logger or progress bar, ``log_every_n_steps``
            ``--log-every``), ``--steps`` optimizer steps per run: rounds of four runs -- plain Trainer (P), with an
            empty Callback (E), with the callback (T), plain again (Q) -- in rotating order; a run's time is its
            training loop (a timestamp callback listed ahead of the telemetrain callback, at ``on_train_start`` and
            ``on_train_end``), per optimizer step, in wall time and in process CPU time (all threads). Ratios: the
            median over rounds of T / mean(P, Q), E / mean(P, Q) and T / E; the control Q/P is the method's noise
            floor. Each T run has a fresh Telemetry whose writer is started before it
  loop      the same model and data in a hand-written loop (``examples/plain_loop.py``'s shape: zero_grad, forward,
            backward, step), bare (P, Q) and inside ``training.training_iteration()`` with a training loop and
            application open (T), the same rounds and ratios

Checks: 1 the Lightning run with the callback / with an empty callback (what the callback adds beyond Lightning's
dispatch of any callback) in process CPU time <= 1.01 (+ the control's noise), else GAP with the cost per step; 2 the
callback's direct per-step cost (hooks row) <= 1% of a plain Lightning step; 3 the hand-written loop's ratio in
process CPU time <= 1.02 (+ noise), else GAP; 4 every telemetry run wrote its lifecycle (one training loop, ok, every
step counted, no error events, no failures in the callback). The steps here are ~1.4 ms (a toy model): 1% is 14 us,
less than the derived-metrics report every ``--log-every`` steps costs averaged over them; GAP says so with numbers.

Usage:
    python bench/bench_lightning.py            # full run (~2 min), markdown on stdout, progress on stderr
    python bench/bench_lightning.py --quick    # short smoke run (< 40 s)
    python bench/bench_lightning.py --json out.json
"""

from __future__ import annotations

import gc
import logging
import os
import statistics
import sys
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


def _row(lib: str, op: str, samples: list[float], n: object, peer: dict[str, Any] | None = None) -> dict[str, Any]:
    return _record(new_row(lib, op, samples, n), peer)


def bench(lib: str, op: str, stmt: str, names: dict[str, Any], *, peer: dict[str, Any] | None = None) -> dict[str, Any]:
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

    def trainer(callbacks: list[Any]) -> Any:
        return pl.Trainer(accelerator="cpu", devices=1, max_steps=ARGS.steps, accumulate_grad_batches=ACCUM,
                          logger=False, enable_checkpointing=False, enable_progress_bar=False,
                          enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
                          log_every_n_steps=ARGS.log_every, callbacks=callbacks)

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

    config = TrainingTelemetryConfig(global_batch_size_or_fn=ARGS.batch * ACCUM,
                                     log_every_n_train_iterations=ARGS.log_every)
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
    cb._phases = True  # the same step with the sub-phase spans (phases=True), in Lightning's order of hooks
    stmt = ("bs(tr, m, b, 0); bb(tr, m, None); ab(tr, m); be(tr, m, o, b, 0); bs(tr, m, b, 1); zg(tr, m, None); "
            "bb(tr, m, None); ab(tr, m); bo(tr, m, None); tr.global_step += 1; be(tr, m, o, b, 1)")
    names.update({"bb": cb.on_before_backward, "ab": cb.on_after_backward, "zg": cb.on_before_zero_grad,
                  "bo": cb.on_before_optimizer_step})
    bench("lightning callback", "the same with phases=True (+ forward, backward x2, zero_grad, optimizer spans)",
          stmt, names, peer=plain)
    cb.recorder.on_train_end()
    cb.recorder.on_app_end()
    t.close()
    EXTRA["hook_failures"] = cb.failures


def _rounds(label: str, what: str, variants: dict[str, tuple[str, Callable[[int], tuple[int, int]]]],
            key: str) -> None:
    """Rounds of the ``variants`` (``P`` plain, ``T`` telemetry, optionally ``E``; ``Q`` is ``P`` again) in rotating
    order; rows, ratios (each variant / mean(P, Q), T / E, control Q/P) and notes under ``key``."""
    names = [*variants, "Q"]
    run = {v: fn for v, (_, fn) in variants.items()}
    run["Q"] = run["P"]
    for v in variants:  # warm-up: first calls, allocator, file cache
        run[v](-1)
    wall: dict[str, list[int]] = {v: [] for v in names}
    cpu: dict[str, list[int]] = {v: [] for v in names}
    for k in range(ARGS.rounds):
        order = names[k % len(names):] + names[:k % len(names)]
        for v in order:
            elapsed, used = run[v](k)
            wall[v].append(elapsed)
            cpu[v].append(used)
        progress(f"{key} round {k + 1}/{ARGS.rounds} ({''.join(order)}): " + ", ".join(
            f"{v} {wall[v][-1] / 1e9:.3f} s" for v in names))
    steps = ARGS.steps

    def ratios(series: dict[str, list[int]], a: str, b: str | None) -> list[float]:
        if b is None:  # a / mean(P, Q)
            return [2 * x / (p + q) for x, p, q in zip(series[a], series["P"], series["Q"], strict=True)]
        return [x / y for x, y in zip(series[a], series[b], strict=True)]

    out: dict[str, Any] = {"rounds": ARGS.rounds}
    for unit, series, suffix in (("ns", wall, ""), ("process CPU ns", cpu, "cpu_")):
        base = _row(label, f"{what}, {variants['P'][0]}, {unit} per optimizer step",
                    [x / steps for x in series["P"] + series["Q"]], steps)
        out[f"{suffix}plain_step_ns"] = base["median_ns"]
        rows = {}
        for v in variants:
            if v == "P":
                continue
            rows[v] = _row(label, f"{what}, {variants[v][0]}, {unit} per optimizer step",
                           [x / steps for x in series[v]], steps, base)
            rs = ratios(series, v, None)
            rows[v]["ratio"], rows[v]["pair_ratios"] = statistics.median(rs), rs
            out[f"{suffix}{v}_ratios"] = rs
        if "E" in variants:
            rs = ratios(series, "T", "E")
            row = _row(label, f"{what}: with telemetry / {variants['E'][0]} (per round), {unit} per optimizer step",
                       [x / steps for x in series["T"]], steps, rows["E"])
            row["ratio"], row["pair_ratios"] = statistics.median(rs), rs
            out[f"{suffix}TE_ratios"] = rs
        rs = ratios(series, "Q", "P")
        row = _row(label, f"control: {variants['P'][0]} vs itself (Q/P, the same rounds), {unit} per optimizer step",
                   [x / steps for x in series["Q"]], steps, base)
        row["ratio"], row["pair_ratios"] = statistics.median(rs), rs
        out[f"{suffix}control_ratios"] = rs
    out["extra_ns_per_step"] = statistics.median(
        (t - (p + q) / 2) / steps for t, p, q in zip(cpu["T"], cpu["P"], cpu["Q"], strict=True))
    if "E" in variants:
        out["extra_vs_E_ns_per_step"] = statistics.median((t - e) / steps for t, e in zip(cpu["T"], cpu["E"],
                                                                                          strict=True))
    EXTRA[key] = out
    NOTES.append(
        f"{key}: {ARGS.rounds} rounds of " + ", ".join(f"{v} ({variants[v][0]})" for v in variants)
        + f" and Q (P again), in rotating order, {steps} optimizer steps a run, one warm-up run of each first. "
        + "Per round, process CPU time: " + "; ".join(
            f"{name} " + ", ".join(f"{r:.4f}" for r in out[f"cpu_{name}_ratios"])
            for name in [*(v for v in variants if v != "P"), *(["TE"] if "E" in variants else []), "control"])
        + " (each variant / mean(P, Q); TE = T / E; control = Q/P)."
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
    import lightning.pytorch as pl

    class Empty(pl.Callback):
        """What any callback costs: Lightning calls every hook of every callback (with a profiler scope each)."""

    empty_cls = Empty
    stores: list[bool] = EXTRA.setdefault("stores", [])

    def fit(callbacks: list[Any]) -> None:
        tr = trainer(callbacks)
        model, data = regressor(), loader()
        if ARGS.collect:
            gc.collect()
        tr.fit(model, data)

    def plain(k: int) -> tuple[int, int]:
        clock = clock_cls()
        fit([clock])
        return clock.end - clock.begin, clock.cpu_end - clock.cpu_begin

    def empty(k: int) -> tuple[int, int]:
        clock = clock_cls()
        fit([clock, empty_cls()])
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
    _rounds("lightning", what, {"P": ("Trainer alone", plain), "E": ("+ an empty Callback", empty),
                                "T": ("+ TelemetrainCallback", telemetry)}, "lightning")


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

    def plain(k: int) -> tuple[int, int]:
        return loop(None)

    def telemetry(k: int) -> tuple[int, int]:
        t = Telemetry(store=os.path.join(tmpdir, f"p{k}"))
        t.event("bench.ready", group="bench")
        t.flush()
        recorder = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=ARGS.batch * ACCUM,
                                                            log_every_n_train_iterations=ARGS.log_every),
                                    telemetry=t)
        contexts = TrainingContexts(lambda: recorder)
        with contexts.application(), contexts.training_loop(train_iterations_start=0):
            elapsed = loop(contexts.training_iteration)
        if k >= 0:
            stores.append(_lifecycle_ok(t, 0))
        t.close()
        return elapsed

    what = f"hand-written loop, MLP 16x{ARGS.width}x1, batch {ARGS.batch} x accumulation {ACCUM}"
    _rounds("plain loop", what, {"P": ("bare", plain), "T": ("in training.training_iteration()", telemetry)}, "loop")


# -- checks -------------------------------------------------------------------------------------------------------


def _noise(tr: dict[str, Any]) -> float:
    noise: float = statistics.median(abs(c - 1.0) for c in tr["cpu_control_ratios"])
    return noise


def checks() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    tr = EXTRA.get("lightning")
    title = ("Lightning fit with TelemetrainCallback / with an empty Callback (what the callback adds beyond "
             "Lightning's dispatch of any callback), process CPU time, <= 1.01 (+ the control's noise)")
    if tr is None:
        out.append({"id": "1", "status": "SKIP", "title": title, "text": "section not run"})
    else:
        te, te_all, noise = statistics.median(tr["cpu_TE_ratios"]), statistics.median(tr["cpu_T_ratios"]), _noise(tr)
        out.append({"id": "1", "status": "PASS" if te <= 1.01 + noise else "GAP", "ratio": te, "title": title,
                    "text": f"median over {tr['rounds']} rounds {te:.4f}x = {tr['extra_vs_E_ns_per_step'] / 1e3:.1f} "
                            f"us per step (hooks, and the derived-metrics report every --log-every steps); all-in (T / "
                            f"no callback) {te_all:.4f}x, {tr['extra_ns_per_step'] / 1e3:.1f} us per step; an empty "
                            "Callback "
                            f"{statistics.median(tr['cpu_E_ratios']):.4f}x; control Q/P "
                            f"{statistics.median(tr['cpu_control_ratios']):.4f}x (median |Q/P - 1| {noise:.2%})"})
    direct = EXTRA.get("direct_ns")
    if direct is None or tr is None:
        out.append({"id": "2", "status": "SKIP", "title": "direct cost", "text": "hooks or lightning section not run"})
    else:
        fraction = direct / tr["cpu_plain_step_ns"]
        out.append({"id": "2", "status": "PASS" if fraction <= 0.01 else "FAIL", "fraction": fraction,
                    "title": "the callback's hooks per step <= 1% of a plain Lightning step",
                    "text": f"{direct / 1e3:.2f} us of {tr['cpu_plain_step_ns'] / 1e6:.3f} ms = {fraction:.3%}"})
    lp = EXTRA.get("loop")
    title = "hand-written loop in training_iteration() / bare, process CPU time, <= 1.02 (+ the control's noise)"
    if lp is None:
        out.append({"id": "3", "status": "SKIP", "title": title, "text": "section not run"})
    else:
        ratio, noise = statistics.median(lp["cpu_T_ratios"]), _noise(lp)
        out.append({"id": "3", "status": "PASS" if ratio <= 1.02 + noise else "GAP", "ratio": ratio, "title": title,
                    "text": f"median over {lp['rounds']} rounds {ratio:.4f}x, {lp['extra_ns_per_step'] / 1e3:.1f} us "
                            f"per step; control Q/P {statistics.median(lp['cpu_control_ratios']):.4f}x "
                            f"(median |Q/P - 1| {noise:.2%})"})
    stores = EXTRA.get("stores", [])
    ok = all(stores) and not EXTRA.get("hook_failures")
    out.append({"id": "4", "status": ("PASS" if ok else "FAIL") if stores else "SKIP",
                "title": "every telemetry run wrote its lifecycle",
                "text": f"{sum(stores)}/{len(stores)} runs complete; hook failures {EXTRA.get('hook_failures', 0)}"})
    return out


def render_table() -> str:
    def cells(r: dict[str, Any]) -> list[str]:
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
    ap.add_argument("--log-every", type=int, default=50,
                    help="log_every_n_steps of the Trainer (the callback's report interval) and of the loop's recorder")
    ap.add_argument("--only", help="comma-separated sections to run (hooks, lightning, loop)")
    ARGS = _method.parse_args(ap, argv)
    ARGS.collect = not ARGS.quick
    if ARGS.quick:
        ARGS.repeats, ARGS.steps, ARGS.rounds, ARGS.warmup_s, ARGS.target_ms, ARGS.min_n = 2, 12, 1, 0.1, 20.0, 200

    def sections(tmpdir: str) -> list[tuple[str, Callable[[], None]]]:
        return [
            ("baseline", section_baseline),
            ("hooks", lambda: section_hooks(tmpdir)),
            ("lightning", lambda: section_lightning(tmpdir)),
            ("loop", lambda: section_loop(tmpdir)),
        ]

    return _method.run_framework_bench("bench_lightning_", sections, checks, render_table, DISTS, EXTRA)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing
    sys.exit(main())
