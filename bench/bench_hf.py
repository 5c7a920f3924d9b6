#!/usr/bin/env python3
"""The per-step cost of ``telemetrain.integrations.hf.TelemetrainHFCallback`` on a Hugging Face ``Trainer``, against
the plain-loop case (the recorder's iteration callbacks a hand-written loop calls) and against the same Trainer
without the callback.

Sections (ns per optimizer step, median and best of ``--repeats``; every row names the row it is compared with):

  baseline  empty function call
  hooks     the plain-loop case: ``TrainingRecorder.on_training_single_iteration_start(); _end()`` (a loop open,
            ``log_every_n_train_iterations=50``, run store at its normal flush interval); the callback's hooks of one
            optimizer step with gradient accumulation 2 called directly (``on_step_begin``, ``on_substep_end``,
            ``on_pre_optimizer_step``, ``on_optimizer_step``, ``on_step_end``: what the callback adds to a step), with
            the plain-loop row as peer; the Trainer's own ``CallbackHandler`` dispatching those five events to its
            default callbacks (``DefaultFlowCallback``, ``PrinterCallback``), and to the same plus the telemetrain
            callback, and the difference (the all-in marginal cost of adding the callback to a Trainer)
  training  a tiny HF training (GPT-2 built from a config: ``--layers`` layers, ``--embd`` wide, sequence ``--seq``,
            micro-batch ``--batch``, gradient accumulation 2, ``torch.set_num_threads(1)``, CPU, logging every 10
            steps, no evaluation or checkpoint), ``--steps`` optimizer steps per run: rounds of three runs -- plain
            Trainer (P), the Trainer with the callback (T), plain again (Q) -- in rotating order; a run's time is
            its training loop (a timestamp callback in every run, at ``on_train_begin`` and ``on_train_end``, both
            ahead of the telemetrain callback), per optimizer step, in wall time and in process CPU time (all
            threads: the run store's writer and the recorder's reporter included). Ratio: the median over rounds of
            T / mean(P, Q); the control Q/P is the method's noise floor. Trainers are built outside the timed region;
            each T run has a fresh Telemetry whose writer is started (one event written) before it

Checks: 1 the training run's ratio in process CPU time <= 1.01 (+ the control's noise; wall time beside); 2 the
callback's direct per-step cost (hooks row) <= 1% of a plain step; 3 every telemetry run wrote its lifecycle (one
training loop, ok, every step counted, no error events, no failures in the callback).

Usage:
    python bench/bench_hf.py            # full run (~2 min), markdown on stdout, progress on stderr
    python bench/bench_hf.py --quick    # short smoke run (< 30 s)
    python bench/bench_hf.py --json out.json
"""

from __future__ import annotations

import contextlib
import copy
import gc
import io
import os
import statistics
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from time import perf_counter_ns, process_time_ns
from typing import Any

import _method
from _method import NOTES, difference_row, measure, new_row, progress

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
warnings.filterwarnings("ignore")

ARGS: Any
EXTRA: dict[str, Any] = {}
DISTS = ("telemetrain", "torch", "transformers", "accelerate")
ACCUM = 2

_record = _method.record_with_peer


def _row(lib: str, op: str, samples: list[float], n: object, peer: dict[str, Any] | None = None) -> dict[str, Any]:
    return _record(new_row(lib, op, samples, n), peer)


def bench(lib: str, op: str, stmt: str, names: dict[str, Any], *, peer: dict[str, Any] | None = None) -> dict[str, Any]:
    samples, n = measure(stmt, names, collect=ARGS.collect)
    return _row(lib, op, samples, n, peer)


# -- the tiny training --------------------------------------------------------------------------------------------


def _parts() -> Any:
    """transformers, torch, and the tiny model/dataset builders (imported here: a missing package skips sections)."""
    import torch
    import transformers

    class Tokens(torch.utils.data.Dataset[dict[str, Any]]):
        def __init__(self, n: int) -> None:
            self.ids = torch.randint(0, 256, (n, ARGS.seq), generator=torch.Generator().manual_seed(0))

        def __len__(self) -> int:
            return int(self.ids.shape[0])

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    class Clock(transformers.TrainerCallback):
        """The training loop's time: on_train_begin to on_train_end (listed ahead of the telemetrain callback)."""

        def __init__(self) -> None:
            self.begin = self.end = self.cpu_begin = self.cpu_end = 0

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.cpu_begin = process_time_ns()
            self.begin = perf_counter_ns()

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.end = perf_counter_ns()
            self.cpu_end = process_time_ns()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=ARGS.layers, n_head=2, n_embd=ARGS.embd, vocab_size=256,
                                     n_positions=ARGS.seq, bos_token_id=0, eos_token_id=0)
    template = transformers.GPT2LMHeadModel(config)
    data = Tokens(ARGS.batch * ACCUM * ARGS.steps)
    return torch, transformers, template, data, Clock


def _train(trainer: Any) -> None:
    """``trainer.train()``, its PrinterCallback's log lines kept off stdout (the report's markdown)."""
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.train()


def _trainer(parts: Any, out: str, callbacks: list[Any]) -> Any:
    _, transformers, template, data, _ = parts
    args = transformers.TrainingArguments(
        output_dir=out, max_steps=ARGS.steps, per_device_train_batch_size=ARGS.batch,
        gradient_accumulation_steps=ACCUM, logging_steps=10, eval_strategy="no", save_strategy="no", report_to=[],
        use_cpu=True, disable_tqdm=True, seed=0, log_level="error",
    )
    return transformers.Trainer(model=copy.deepcopy(template), args=args, train_dataset=data, callbacks=callbacks)


# -- sections -----------------------------------------------------------------------------------------------------


def section_baseline() -> None:
    def f() -> None:
        pass

    bench("baseline", "empty function call `f()`", "f()", {"f": f})


def section_hooks(tmpdir: str) -> None:
    from telemetrain import Telemetry
    from telemetrain.integrations.hf import TelemetrainHFCallback
    from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

    parts = _parts()
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
    cb = TelemetrainHFCallback(telemetry=t, recorder=TrainingRecorder(telemetry=t))
    trainer = _trainer(parts, os.path.join(tmpdir, "out"), [cb])
    a, s, c = trainer.args, trainer.state, trainer.control
    s.logging_steps, s.max_steps = 50, 10**9
    cb.on_train_begin(a, s, c)
    stmt = "begin(a, s, c); sub(a, s, c); pre(a, s, c); opt(a, s, c); end(a, s, c)"
    names = {"a": a, "s": s, "c": c, "begin": cb.on_step_begin, "sub": cb.on_substep_end,
             "pre": cb.on_pre_optimizer_step, "opt": cb.on_optimizer_step, "end": cb.on_step_end}
    direct = bench("hf callback", "1 step (accumulation 2): the callback's 5 hooks called directly", stmt, names,
                   peer=plain)
    EXTRA["direct_ns"] = direct["median_ns"]
    cb.on_train_end(a, s, c)
    failures = cb.failures

    # the Trainer's own dispatch (DefaultFlowCallback first: it sets the control flags the callback reads)
    h_plain = _trainer(parts, os.path.join(tmpdir, "out"), []).callback_handler
    h_with = trainer.callback_handler
    cb.on_train_begin(a, s, c)
    stmt = "h.on_step_begin(a, s, c); h.on_substep_end(a, s, c); h.on_pre_optimizer_step(a, s, c); " \
           "h.on_optimizer_step(a, s, c); h.on_step_end(a, s, c)"
    s.global_step = 1  # (not a multiple of logging_steps: DefaultFlowCallback sets no flag)
    d_plain = bench("hf dispatch", "1 step's 5 events through CallbackHandler, default callbacks only", stmt,
                    {"h": h_plain, "a": a, "s": s, "c": c})
    d_with = bench("hf dispatch", "same, + TelemetrainHFCallback", stmt, {"h": h_with, "a": a, "s": s, "c": c},
                   peer=d_plain)
    _record(difference_row("hf dispatch", "adding the callback to a Trainer: marginal cost per step (difference)",
                           d_with, d_plain), plain)
    cb.on_train_end(a, s, c)
    t.close()
    EXTRA["hook_failures"] = failures + cb.failures


def section_training(tmpdir: str) -> None:
    from telemetrain import Telemetry
    from telemetrain.integrations.hf import TelemetrainHFCallback
    from telemetrain.store import open_run

    parts = _parts()
    clock_cls = parts[4]
    out = os.path.join(tmpdir, "train")

    def plain() -> tuple[int, int]:
        clock = clock_cls()
        trainer = _trainer(parts, out, [clock])
        if ARGS.collect:
            gc.collect()
        _train(trainer)
        return clock.end - clock.begin, clock.cpu_end - clock.cpu_begin

    stores: list[dict[str, Any]] = []

    def telemetry(k: int) -> tuple[int, int]:
        t = Telemetry(store=os.path.join(tmpdir, f"t{k}"))
        t.event("bench.ready", group="bench")  # the store's writer thread started, as in a job already running
        t.flush()
        clock = clock_cls()
        cb = TelemetrainHFCallback(telemetry=t)
        trainer = _trainer(parts, out, [clock, cb])
        if ARGS.collect:
            gc.collect()
        _train(trainer)
        elapsed = clock.end - clock.begin, clock.cpu_end - clock.cpu_begin
        t.flush()
        assert t.run_dir is not None  # made with store=
        records = open_run(t.run_dir).records()
        loops = [x for x in records if x.kind == "span_end" and x.name == "training_loop"]
        reports = [x.attributes for x in records if x.kind == "event" and x.name == "training_metrics_update"]
        errors = [x for x in records if x.kind == "event" and x.name == "error"]
        ok = (len(loops) == 1 and loops[0].status == "ok" and bool(reports)
              and reports[-1]["num_iterations"] == ARGS.steps and not errors and cb.failures == 0)
        stores.append({"ok": ok, "reports": len(reports), "errors": len(errors), "failures": cb.failures})
        t.close()
        return elapsed

    plain()  # warm-up: first calls, allocator, file cache
    telemetry(-1)
    stores.clear()
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
        progress(f"round {k + 1}/{ARGS.rounds} ({''.join(orders[k % 3])}): plain {p / 1e9:.3f} s / {q / 1e9:.3f} s, "
                 f"telemetry {t / 1e9:.3f} s: ratio {ratios[-1]:.4f} (CPU time {cpu_ratios[-1]:.4f}), "
                 f"control Q/P {controls[-1]:.4f} (CPU time {cpu_controls[-1]:.4f})")
    steps = ARGS.steps
    what = f"GPT-2 {ARGS.layers}x{ARGS.embd}, seq {ARGS.seq}, batch {ARGS.batch} x accumulation {ACCUM}"
    p_row = _row("hf training", f"{what}: Trainer, no callback, ns per optimizer step",
                 [x / steps for x in runs["P"] + runs["Q"]], steps)
    t_row = _row("hf training", f"{what}: Trainer + TelemetrainHFCallback, ns per optimizer step",
                 [x / steps for x in runs["T"]], steps, p_row)
    t_row["ratio"], t_row["pair_ratios"] = statistics.median(ratios), ratios
    c_row = _row("hf training", "control: no callback vs no callback (Q/P, the same rounds), ns per optimizer step",
                 [x / steps for x in runs["Q"]], steps, p_row)
    c_row["ratio"], c_row["pair_ratios"] = statistics.median(controls), controls
    pc_row = _row("hf training", f"{what}: Trainer, no callback, process CPU ns per optimizer step",
                  [x / steps for x in cpu["P"] + cpu["Q"]], steps)
    tc_row = _row("hf training", f"{what}: Trainer + TelemetrainHFCallback, process CPU ns per optimizer step",
                  [x / steps for x in cpu["T"]], steps, pc_row)
    tc_row["ratio"], tc_row["pair_ratios"] = statistics.median(cpu_ratios), cpu_ratios
    cc_row = _row("hf training", "control, process CPU ns per optimizer step (Q/P)", [x / steps for x in cpu["Q"]],
                  steps, pc_row)
    cc_row["ratio"], cc_row["pair_ratios"] = statistics.median(cpu_controls), cpu_controls
    EXTRA["training"] = {
        "rounds": [{"order": "".join(orders[k % 3]), "P_ns": runs["P"][k], "T_ns": runs["T"][k], "Q_ns": runs["Q"][k],
                    "ratio": ratios[k], "control": controls[k], "P_cpu_ns": cpu["P"][k], "T_cpu_ns": cpu["T"][k],
                    "Q_cpu_ns": cpu["Q"][k], "cpu_ratio": cpu_ratios[k], "cpu_control": cpu_controls[k]}
                   for k in range(ARGS.rounds)],
        "median_ratio": statistics.median(ratios),
        "median_control": statistics.median(controls),
        "control_abs_dev_median": statistics.median(abs(c - 1.0) for c in controls),
        "median_cpu_ratio": statistics.median(cpu_ratios),
        "median_cpu_control": statistics.median(cpu_controls),
        "cpu_control_abs_dev_median": statistics.median(abs(c - 1.0) for c in cpu_controls),
        "plain_step_ns": p_row["median_ns"],
        "stores": stores,
        "steps": steps,
    }
    NOTES.append(
        f"training: {ARGS.rounds} rounds of plain (P) / telemetry (T) / plain (Q) in rotating order (PTQ, TQP, QPT), "
        f"{steps} optimizer steps a run, one warm-up run of each first; "
        f"{'gc.collect() before each run' if ARGS.collect else 'no gc.collect() (--quick)'}. Ratio T / mean(P, Q) "
        "per round: " + ", ".join(f"{r:.4f}" for r in ratios)
        + "; control Q/P per round: " + ", ".join(f"{r:.4f}" for r in controls)
        + ". The same in process CPU time (all threads: the run store's writer and the recorder's reporter included; "
        "less sensitive to other processes on a shared machine): " + ", ".join(f"{r:.4f}" for r in cpu_ratios)
        + "; control " + ", ".join(f"{r:.4f}" for r in cpu_controls) + "."
    )


# -- checks -------------------------------------------------------------------------------------------------------


def checks() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    tr = EXTRA.get("training")
    if tr is None:
        out.append({"id": "1", "status": "SKIP", "title": "training run", "text": "section not run"})
    else:
        ratio, noise = tr["median_cpu_ratio"], tr["cpu_control_abs_dev_median"]
        out.append({"id": "1", "status": "PASS" if ratio <= 1.01 + noise else "FAIL", "ratio": ratio,
                    "wall_ratio": tr["median_ratio"],
                    "title": "training run with the callback / without, process CPU time, <= 1.01 (+ the control's "
                             "noise)",
                    "text": f"median over {len(tr['rounds'])} rounds {ratio:.4f}x; control Q/P "
                            f"{tr['median_cpu_control']:.4f}x (median |Q/P - 1| {noise:.2%}); wall time "
                            f"{tr['median_ratio']:.4f}x, control {tr['median_control']:.4f}x (median |Q/P - 1| "
                            f"{tr['control_abs_dev_median']:.2%})"})
    direct = EXTRA.get("direct_ns")
    if direct is None or tr is None:
        out.append({"id": "2", "status": "SKIP", "title": "direct cost", "text": "hooks or training section not run"})
    else:
        fraction = direct / tr["plain_step_ns"]
        out.append({"id": "2", "status": "PASS" if fraction <= 0.01 else "FAIL", "fraction": fraction,
                    "title": "the callback's hooks per step <= 1% of a plain Trainer step",
                    "text": f"{direct / 1e3:.1f} us of {tr['plain_step_ns'] / 1e6:.2f} ms = {fraction:.3%}"})
    stores = (tr or {}).get("stores", [])
    ok = bool(stores) and all(s["ok"] for s in stores) and not EXTRA.get("hook_failures")
    out.append({"id": "3", "status": "PASS" if ok else "FAIL", "title": "every telemetry run wrote its lifecycle",
                "text": f"{sum(s['ok'] for s in stores)}/{len(stores)} runs complete; hook failures "
                        f"{EXTRA.get('hook_failures', 0)}"})
    return out


def render_table() -> str:
    def cells(r: dict[str, Any]) -> list[str]:
        ratio = "" if r.get("ratio") is None else f"{r['ratio']:.3f}x"
        return [ratio, r.get("peer") or ""]

    return _method.render_table([("ratio to peer", "---:"), ("peer", "---")], cells)


def main(argv: list[str] | None = None) -> int:
    global ARGS
    ap = _method.parser(__doc__, "short smoke run (< 30 s)")
    ap.set_defaults(repeats=7, min_n=2_000)
    ap.add_argument("--steps", type=int, default=100, help="optimizer steps per training run")
    ap.add_argument("--rounds", type=int, default=7, help="rounds of three training runs (plain, telemetry, plain)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--embd", type=int, default=64)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--only", help="comma-separated sections to run (hooks, training)")
    ARGS = _method.parse_args(ap, argv)
    ARGS.collect = not ARGS.quick
    if ARGS.quick:
        ARGS.repeats, ARGS.steps, ARGS.rounds, ARGS.warmup_s, ARGS.target_ms, ARGS.min_n = 2, 12, 1, 0.1, 20.0, 200

    def sections(tmpdir: str) -> list[tuple[str, Callable[[], None]]]:
        return [
            ("baseline", section_baseline),
            ("hooks", lambda: section_hooks(tmpdir)),
            ("training", lambda: section_training(tmpdir)),
        ]

    return _method.run_framework_bench("bench_hf_", sections, checks, render_table, DISTS, EXTRA)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing
    sys.exit(main())
