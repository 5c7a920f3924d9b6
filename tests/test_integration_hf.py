"""The Hugging Face Trainer integration against a real ``transformers.Trainer`` (a 1-layer GPT-2 built from a config,
synthetic token data, CPU, nothing downloaded): optimizer steps as iterations with micro-batches counted, evaluation
loops, checkpoint saves that cover the files written, the Trainer's logs as metrics (NaN kept), a resume, and an
exception in the model's forward that ends the spans with status error while the next ``train()`` works."""

from __future__ import annotations

import math
import os
import re
import runpy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from telemetrain import Telemetry  # noqa: E402
from telemetrain.training import TrainingTelemetryConfig  # noqa: E402

hf = pytest.importorskip("telemetrain.integrations.hf")

SEQ = 16
BATCH = 4
ACCUM = 2
COARSE_CLOCK_NS = 10_000_000


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No hub access."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


class Tokens(torch.utils.data.Dataset):  # type: ignore[misc, name-defined]  # (a base from pytest.importorskip's module object: Any to mypy)
    """``n`` fixed random token sequences; each is its own label (causal LM)."""

    def __init__(self, n: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 64, (n, SEQ), generator=g)

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class FlakyGPT2(transformers.GPT2LMHeadModel):  # type: ignore[misc, name-defined]  # (a base from pytest.importorskip's module object: Any to mypy)
    """A GPT-2 whose forward raises on its ``fail_on_call``-th call (None: never)."""

    fail_on_call: int | None = None
    calls = 0

    def forward(self, input_ids: Any = None, labels: Any = None, **kwargs: Any) -> Any:
        # (named parameters: the Trainer keeps only the batch keys the forward's signature names)
        self.calls += 1
        if self.calls == self.fail_on_call:
            raise RuntimeError("boom in forward")
        return super().forward(input_ids=input_ids, labels=labels, **kwargs)


def _model() -> Any:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=32,
                                     bos_token_id=0, eos_token_id=0)
    return FlakyGPT2(config)


def _trainer(tmp_path: Path, cb: Any, model: Any | None = None, *, train: Any = None, **overrides: Any) -> Any:
    settings: dict[str, Any] = dict(
        output_dir=str(tmp_path / "out"), max_steps=10, per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH, gradient_accumulation_steps=ACCUM, eval_strategy="steps", eval_steps=5,
        save_steps=5, logging_steps=2, report_to=[], use_cpu=True, disable_tqdm=True, seed=0,
    )
    settings.update(overrides)
    args = transformers.TrainingArguments(**settings)
    return transformers.Trainer(model=model if model is not None else _model(), args=args,
                                train_dataset=Tokens(64) if train is None else train, eval_dataset=Tokens(12, seed=1),
                                callbacks=[cb])


class Span(NamedTuple):
    """A span's start and end records together (wall times in ns)."""

    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    status: str
    error: str
    attributes: dict[str, Any]


def _spans(records: list[Any], name: str) -> list[Span]:
    """The ended spans called ``name``, in start order."""
    starts = {r.span_id: r for r in records if r.kind == "span_start" and r.name == name}
    out = []
    for end in (r for r in records if r.kind == "span_end" and r.name == name):
        start = starts[end.span_id]
        out.append(Span(end.span_id, start.parent_id, start.wall_ns, end.wall_ns, end.status, end.error,
                        {**(start.attributes or {}), **(end.attributes or {})}))
    return sorted(out, key=lambda s: s.start_ns)


def _events(records: list[Any], name: str) -> list[dict[str, Any]]:
    return [r.attributes for r in records if r.kind == "event" and r.name == name]


def _metrics(records: list[Any], name: str, group: str = "hf") -> list[tuple[int | None, float]]:
    return [(r.step, r.value) for r in records if r.kind == "metric" and r.group == group and r.name == name]


def test_steps_evaluations_saves_and_logs_are_recorded(tmp_path: Path, telemetry: Telemetry,
                                                       read_run: Callable[..., Any]) -> None:
    cb = hf.TelemetrainHFCallback(telemetry=telemetry)
    trainer = _trainer(tmp_path, cb)
    with cb.guard():
        trainer.train()
    records = read_run(telemetry)
    steps = trainer.state.global_step
    assert steps == 10 and cb.failures == 0

    # one application, one training loop, both ok; iterations are optimizer steps, micro-batches counted
    (app,) = _spans(records, "application")
    (loop,) = _spans(records, "training_loop")
    assert app.status == "ok" and loop.status == "ok" and loop.parent_id == app.span_id
    assert app.start_ns < loop.start_ns and loop.end_ns <= app.end_ns  # from the Trainer's construction on
    reports = _events(records, "training_metrics_update")
    assert reports[-1]["num_iterations"] == steps and reports[-1]["current_iteration"] == steps - 1
    assert [r["current_iteration"] for r in reports] == [1, 3, 5, 7, 9]  # every logging_steps=2 optimizer steps
    assert cb.micro_batches == steps * ACCUM
    assert _metrics(records, "micro_batches")[-1] == (steps - 1, steps * ACCUM)  # at each training log
    assert loop.attributes["micro_batches"] == steps * ACCUM
    first, config = _events(records, "update_training_telemetry_config")  # the second knows the first batch
    assert "seq_length" not in first and config["global_batch_size"] == BATCH * ACCUM and config["seq_length"] == SEQ
    assert config["micro_batch_size"] == BATCH and config["train_iterations_target"] == steps
    assert reports[-1]["train_tokens"] == steps * BATCH * ACCUM * SEQ
    iterations = _spans(records, "training_single_iteration")
    assert iterations and all(s.parent_id == loop.span_id for s in iterations)
    phases = [r for r in records if r.kind == "metric" and r.name == "train.phase.duration"]
    assert {r.attributes["train.phase"] for r in phases} == {"optimizer"}  # on_pre_optimizer_step..on_optimizer_step

    # an evaluation every 5 steps: 12 samples in batches of 4 -> 3 iterations each
    validations = _events(records, "validation_metrics_update")
    assert [v["num_iterations"] for v in validations] == [3, 3]
    assert [v["current_iteration"] for v in validations] == [4, 9]
    assert len(_spans(records, "validation_loop")) == 2

    # a save every 5 steps, after the evaluation; each save span covers the files the Trainer wrote
    successes = _events(records, "save_checkpoint_success")
    assert [s["current_iteration"] for s in successes] == [5, 10]
    saves = _spans(records, "checkpoint_save_sync")
    assert [s.status for s in saves] == ["ok", "ok"]
    for success, save, evaluation in zip(successes, saves, _spans(records, "validation_loop"), strict=True):
        folder = Path(success["checkpoint_directory"])
        assert folder == tmp_path / "out" / f"checkpoint-{success['current_iteration']}"
        assert success["checkpoint_size"] == sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        written = [f.stat().st_mtime_ns for f in folder.rglob("*") if f.is_file()]
        assert save.start_ns <= min(written) and max(written) <= save.end_ns
        assert evaluation.end_ns <= save.start_ns  # the evaluation ran first: not in the save

    # the Trainer's logs: the same values as its own log history, at the zero-based index of the step they were
    # logged after (its global step - 1), the step of the derived metrics of the same window
    logged = [(h["step"] - 1, h["loss"]) for h in trainer.state.log_history if "loss" in h]
    assert _metrics(records, "loss") == logged  # (floats round-trip the store exactly)
    evals = [(h["step"] - 1, h["eval_loss"]) for h in trainer.state.log_history if "eval_loss" in h]
    assert _metrics(records, "eval_loss") == evals
    assert [step for step, _ in _metrics(records, "learning_rate")] == [1, 3, 5, 7, 9]
    throughput_steps = [step for step, _ in _metrics(records, "train.samples_per_second", group="training")]
    assert throughput_steps == [r["current_iteration"] for r in reports] == [1, 3, 5, 7, 9]  # the same axis
    # the Trainer's arguments and the model's config, once, as hyperparameters
    (hparams,) = [r.attributes for r in records if r.kind == "event" and r.name == "hyperparameters"]
    assert hparams["learning_rate"] == trainer.args.learning_rate and hparams["logging_steps"] == 2
    assert hparams["model.vocab_size"] == trainer.model.config.vocab_size


def test_stand_alone_evaluate_and_predict(tmp_path: Path, telemetry: Telemetry,
                                          read_run: Callable[..., Any]) -> None:
    """Outside train(): evaluate() is a validation loop, predict() a testing loop; no hook precedes the first batch,
    so it is not timed as an iteration (and said so)."""
    cb = hf.TelemetrainHFCallback(telemetry=telemetry)
    trainer = _trainer(tmp_path, cb, eval_strategy="no")
    trainer.evaluate()
    trainer.predict(Tokens(20, seed=2))
    records = read_run(telemetry)
    (validation,) = _events(records, "validation_metrics_update")
    assert validation["num_iterations"] == 2  # 3 batches, the first untimed
    (loop,) = _spans(records, "validation_loop")
    assert loop.attributes["untimed_iterations"] == 1
    (testing,) = _events(records, "testing_metrics_update")
    assert testing["num_iterations"] == 4  # 5 batches
    assert not _spans(records, "training_loop") and cb.failures == 0


def test_nan_loss_is_stored_as_nan(tmp_path: Path, telemetry: Telemetry, read_run: Callable[..., Any]) -> None:
    model = _model()
    with torch.no_grad():
        model.lm_head.weight.fill_(float("nan"))  # (tied to the embedding: every logit is NaN)
    cb = hf.TelemetrainHFCallback(telemetry=telemetry)
    trainer = _trainer(tmp_path, cb, model=model, max_steps=2, logging_steps=1, eval_strategy="no",
                       save_strategy="no", logging_nan_inf_filter=False)
    trainer.train()
    assert all(math.isnan(h["loss"]) for h in trainer.state.log_history if "loss" in h)
    losses = _metrics(read_run(telemetry), "loss")
    assert [step for step, _ in losses] == [0, 1]
    assert all(math.isnan(value) for _, value in losses)


def _failing_run(tmp_path: Path, telemetry: Telemetry, *, guarded: bool) -> tuple[Any, Any]:
    """A train() whose forward raises at the first micro-batch of step 4, then a train() that completes."""
    cb = hf.TelemetrainHFCallback(telemetry=telemetry)
    model = _model()
    model.fail_on_call = 3 * ACCUM + 1
    trainer = _trainer(tmp_path, cb, model=model, max_steps=6, eval_strategy="no", save_strategy="no")
    with pytest.raises(RuntimeError, match="boom in forward"):
        if guarded:
            with cb.guard():
                trainer.train()
        else:
            trainer.train()
    model.fail_on_call = None
    if guarded:
        with cb.guard():
            trainer.train()
    else:
        trainer.train()
    return cb, trainer


@pytest.mark.parametrize("guarded", [True, False], ids=["guard", "next-train"])
def test_an_exception_in_forward_ends_the_spans_with_error_and_the_next_train_works(
    tmp_path: Path, telemetry: Telemetry, read_run: Callable[..., Any], guarded: bool
) -> None:
    cb, trainer = _failing_run(tmp_path, telemetry, guarded=guarded)
    records = read_run(telemetry)
    assert cb.failures == 0
    failed, ok = _spans(records, "training_loop")
    assert failed.status == "error" and ok.status == "ok"
    if guarded:
        assert "boom in forward" in failed.error
    broken = [s for s in _spans(records, "training_single_iteration") if s.status == "error"]
    assert len(broken) == 1 and broken[0].parent_id == failed.span_id
    apps = _spans(records, "application")
    assert [a.status for a in apps] == ["error", "ok"]
    # the failed call reported its 3 completed steps (the failing one is not counted), the next its 6
    finals = [r for r in _events(records, "training_metrics_update") if r["final"]]
    assert finals[0]["num_iterations"] == 3 and finals[0]["current_iteration"] == 2
    last = _events(records, "training_metrics_update")[-1]
    assert last["num_iterations"] == trainer.state.global_step == 6 and last["current_iteration"] == 5
    assert not [s for s in _spans(records, "optimizer_update") if s.status != "ok"]
    if not guarded:  # ended at the last hook the failed call reached, not when the next one noticed
        assert failed.end_ns <= ok.start_ns


def test_an_exception_during_an_evaluation_ends_it_with_error(tmp_path: Path, telemetry: Telemetry,
                                                              read_run: Callable[..., Any]) -> None:
    """The evaluation after step 3 (batches 7, 8, 9 of the forward's calls) fails at its second batch."""
    cb = hf.TelemetrainHFCallback(telemetry=telemetry)
    model = _model()
    model.fail_on_call = 3 * ACCUM + 2
    trainer = _trainer(tmp_path, cb, model=model, max_steps=6, eval_steps=3, save_strategy="no")
    with pytest.raises(RuntimeError, match="boom in forward"), cb.guard():
        trainer.train()
    records = read_run(telemetry)
    (validation,) = _spans(records, "validation_loop")
    assert validation.status == "error" and "boom in forward" in validation.error
    (event,) = _events(records, "validation_metrics_update")
    assert event["num_iterations"] == 1  # the batch that completed
    (loop,) = _spans(records, "training_loop")
    assert loop.status == "error" and loop.start_ns <= validation.start_ns
    assert _events(records, "training_metrics_update")[-1]["num_iterations"] == 3
    assert not _spans(records, "checkpoint_save_sync") and cb.failures == 0


def test_a_failed_save_is_a_save_span_with_status_error(tmp_path: Path, telemetry: Telemetry,
                                                        read_run: Callable[..., Any]) -> None:
    """A file where the checkpoint folder goes: the Trainer's save raises after the last hook before it."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "checkpoint-2").write_text("in the way")
    cb = hf.TelemetrainHFCallback(telemetry=telemetry)
    trainer = _trainer(tmp_path, cb, max_steps=4, save_steps=2, eval_strategy="no")
    with pytest.raises(OSError), pytest.warns(Warning, match="without on_save_checkpoint_success"), cb.guard():
        trainer.train()
    records = read_run(telemetry)
    (save,) = _spans(records, "checkpoint_save_sync")
    assert save.status == "error" and save.attributes["current_iteration"] == 2
    assert not _events(records, "save_checkpoint_success")
    (loop,) = _spans(records, "training_loop")
    assert loop.status == "error" and loop.end_ns >= save.end_ns
    assert _events(records, "training_metrics_update")[-1]["num_iterations"] == 2


def test_resume_from_checkpoint_starts_at_its_step_and_records_the_load(
    tmp_path: Path, telemetry: Telemetry, read_run: Callable[..., Any]
) -> None:
    cb = hf.TelemetrainHFCallback(telemetry=telemetry)
    with cb.guard():
        _trainer(tmp_path, cb, max_steps=4, save_steps=4, eval_strategy="no").train()
    resumed = _trainer(tmp_path, cb, max_steps=6, save_steps=100, eval_strategy="no")
    with cb.guard():
        resumed.train(resume_from_checkpoint=True)
    records = read_run(telemetry)
    first, second = _spans(records, "training_loop")
    assert first.attributes["train_iterations_start"] == 0
    assert second.attributes["train_iterations_start"] == 4
    (load,) = _spans(records, "checkpoint_load")
    assert load.attributes["includes_setup"] is True and load.attributes["global_step"] == 4
    assert load.end_ns <= second.start_ns  # before the loop starts
    last = _events(records, "training_metrics_update")[-1]
    assert last["current_iteration"] == 5 and last["num_iterations"] == 2
    assert last["load_checkpoint_count"] == 1 and last["load_checkpoint_size_bytes"] > 0


def test_a_given_config_is_used_as_is(tmp_path: Path, telemetry: Telemetry, read_run: Callable[..., Any]) -> None:
    config = TrainingTelemetryConfig(global_batch_size_or_fn=123, perf_tag_or_fn="hf-test",
                                     log_every_n_train_iterations=3)
    cb = hf.TelemetrainHFCallback(config, telemetry=telemetry)
    _trainer(tmp_path, cb, max_steps=3, eval_strategy="no", save_strategy="no").train()
    records = read_run(telemetry)
    (event,) = _events(records, "update_training_telemetry_config")
    assert event["global_batch_size"] == 123 and event["perf_tag"] == "hf-test"
    (report,) = _events(records, "training_metrics_update")
    assert report["num_train_samples"] == 3 * 123


def test_epoch_logging_reports_the_derived_metrics_with_each_epoch_log(tmp_path: Path, telemetry: Telemetry,
                                                                      read_run: Callable[..., Any]) -> None:
    """``logging_strategy="epoch"``: the reports come with the Trainer's epoch logs (``logging_steps``, 500 by
    default, is not the interval then). 16 batches, accumulation 3: 6 steps an epoch (the last one short)."""
    cb = hf.TelemetrainHFCallback(telemetry=telemetry)
    _trainer(tmp_path, cb, max_steps=-1, num_train_epochs=2, gradient_accumulation_steps=3,
             logging_strategy="epoch", eval_strategy="no", save_strategy="no").train()
    records = read_run(telemetry)
    assert [step for step, _ in _metrics(records, "loss")] == [5, 11]
    reports = _events(records, "training_metrics_update")
    assert [r["current_iteration"] for r in reports] == [5, 11]
    assert _events(records, "update_training_telemetry_config")[-1]["log_every_n_train_iterations"] == 6


def test_a_short_last_batch_counts_its_own_samples(tmp_path: Path, telemetry: Telemetry,
                                                   read_run: Callable[..., Any]) -> None:
    """22 samples in batches of 4, accumulation 2: micro-batches of 4, 4, 4, 4, 4 and 2, so an epoch's steps take
    8, 8 and 6 samples. Each epoch counts 22 samples (and 22 x SEQ tokens), not 3 full global batches (24), and the
    samples/s of its report are over those 22."""
    cb = hf.TelemetrainHFCallback(telemetry=telemetry)
    trainer = _trainer(tmp_path, cb, train=Tokens(22), max_steps=-1, num_train_epochs=2, logging_steps=3,
                       eval_strategy="no", save_strategy="no")
    trainer.train()
    assert trainer.state.global_step == 6 and cb.failures == 0
    records = read_run(telemetry)
    reports = _events(records, "training_metrics_update")
    assert [r["current_iteration"] for r in reports] == [2, 5]
    assert [r["num_train_samples"] for r in reports] == [22, 44]
    assert [r["train_tokens"] for r in reports] == [22 * SEQ, 44 * SEQ]
    assert _metrics(records, "train.samples", group="training") == [(2, 22), (5, 44)]
    for report in reports:  # samples/s: the window's 22 samples over the time it ran
        run_s = report["window_seconds"] - report["window_paused_seconds"]
        assert report["window_samples"] == 22 and report["samples_per_second"] == pytest.approx(22 / run_s)
    assert cb.micro_batches == 12


def test_max_steps_mid_epoch_counts_the_short_step_before_it(tmp_path: Path, telemetry: Telemetry,
                                                            read_run: Callable[..., Any]) -> None:
    """max_steps=4 over epochs of 3 steps (8, 8 and 6 samples): the run ends one step into the second epoch,
    22 + 8 samples."""
    cb = hf.TelemetrainHFCallback(telemetry=telemetry)
    trainer = _trainer(tmp_path, cb, train=Tokens(22), max_steps=4, logging_steps=4, eval_strategy="no",
                       save_strategy="no")
    trainer.train()
    assert trainer.state.global_step == 4
    (report,) = _events(read_run(telemetry), "training_metrics_update")
    assert report["num_train_samples"] == 30 and report["train_tokens"] == 30 * SEQ


class Padded(Tokens):
    """Sequences whose last ``i % 4`` positions are padding (``attention_mask`` 0)."""

    def __getitem__(self, i: int) -> dict[str, Any]:
        mask = torch.ones(SEQ, dtype=torch.long)
        mask[SEQ - i % 4:] = 0
        return {"input_ids": self.ids[i], "labels": self.ids[i], "attention_mask": mask}


def test_the_trainers_own_token_count_is_the_tokens(tmp_path: Path, telemetry: Telemetry,
                                                    read_run: Callable[..., Any]) -> None:
    """``include_num_input_tokens_seen="non_padding"``: the Trainer counts the tokens that are not padding (all
    ranks), and the derived metrics count those, not samples x the padded length."""
    data = Padded(22)
    cb = hf.TelemetrainHFCallback(telemetry=telemetry)
    trainer = _trainer(tmp_path, cb, train=data, max_steps=-1, num_train_epochs=1, logging_steps=3,
                       eval_strategy="no", save_strategy="no", include_num_input_tokens_seen="non_padding",
                       remove_unused_columns=False)
    trainer.train()
    real = sum(int(data[i]["attention_mask"].sum()) for i in range(len(data)))
    assert real < 22 * SEQ and trainer.state.num_input_tokens_seen == real
    (report,) = _events(read_run(telemetry), "training_metrics_update")
    assert report["num_train_samples"] == 22 and report["train_tokens"] == real


def test_overrides_go_on_top_of_the_derived_config(tmp_path: Path, telemetry: Telemetry,
                                                   read_run: Callable[..., Any]) -> None:
    cb = hf.TelemetrainHFCallback(telemetry=telemetry, seq_length=99, flops_per_sample=1e6, peak_tflops_per_gpu=1.0)
    _trainer(tmp_path, cb, max_steps=2, logging_steps=2, eval_strategy="no", save_strategy="no").train()
    records = read_run(telemetry)
    configs = _events(records, "update_training_telemetry_config")
    assert {c["seq_length"] for c in configs} == {99}  # the first batch's 16 does not replace it
    assert configs[-1]["micro_batch_size"] == BATCH and configs[-1]["global_batch_size"] == BATCH * ACCUM
    (report,) = _events(records, "training_metrics_update")
    assert report["total_flops"] == 2 * BATCH * ACCUM * 1e6 and report["peak_tflops_per_gpu"] == 1.0
    assert report["mfu"] == pytest.approx(report["train_throughput_per_gpu"] / 1.0)


def test_a_failing_config_function_does_not_break_training(tmp_path: Path, telemetry: Telemetry,
                                                           read_run: Callable[..., Any]) -> None:
    def broken() -> int:
        raise ZeroDivisionError("no sequence length")

    config = TrainingTelemetryConfig(global_batch_size_or_fn=8, seq_length_or_fn=broken,
                                     log_every_n_train_iterations=2)
    cb = hf.TelemetrainHFCallback(config, telemetry=telemetry)
    trainer = _trainer(tmp_path, cb, max_steps=4, eval_strategy="no", save_strategy="no")
    with pytest.warns(Warning, match="no sequence length"):
        trainer.train()
    assert trainer.state.global_step == 4
    records = read_run(telemetry)
    assert any("no sequence length" in e["error_message"] for e in _events(records, "error"))
    assert [s.status for s in _spans(records, "training_loop")] == ["ok"]


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"config": {"global_batch_size_or_fn": 8}}, TypeError),
    ({"flops_per_sample": -1.0}, ValueError),
    ({"seq_lenght": 16}, TypeError),
    ({"config": TrainingTelemetryConfig(global_batch_size_or_fn=8), "seq_length": 16}, ValueError),
    ({"telemetry": "t"}, TypeError),
    ({"recorder": object()}, TypeError),
    ({"metrics_group": ""}, TypeError),
])
def test_bad_arguments_raise_naming_the_argument(telemetry: Telemetry, kwargs: dict[str, Any],
                                                 error: type[Exception]) -> None:
    with pytest.raises(error, match=next(iter(kwargs))):
        hf.TelemetrainHFCallback(**kwargs)


def test_the_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """examples/hf_trainer.py, run as a script in this process (torch and transformers are imported already)."""
    example = Path(__file__).resolve().parents[1] / "examples" / "hf_trainer.py"
    monkeypatch.setenv("TELEMETRAIN_DIR", str(tmp_path / "runs"))
    monkeypatch.setattr(sys, "argv", [str(example), "--steps", "4"])
    runpy.run_path(str(example), run_name="__main__")
    out = capsys.readouterr().out
    assert "training_loop ok: 1" in out and "checkpoint_save_sync ok: 2" in out
    assert "iterations (optimizer steps): 4, micro-batches: 8" in out
    assert "checkpoints saved: 2" in out  # saves at steps 2 and 4, the second after the last report
    assert re.search(r"throughput in the last report window \(\d+ iterations, training time only\): [\d.]+ samples/s",
                     out)
    assert str(tmp_path / "runs") in out
