"""The console sink: one readable line per record, colour only on a terminal."""

from __future__ import annotations

import io
import os
import pty
from pathlib import Path

import pytest

import telemetrain
from telemetrain import Diagnostic, Identity, SpanEnd, SpanStart, StatWindow
from telemetrain.sinks import ConsoleSink

ESC = "\x1b["


def _identity() -> Identity:
    return telemetrain.identity_from_env(env={"RANK": "3", "WORLD_SIZE": "4"})


def _lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_one_line_per_record_of_every_kind_without_colour_off_a_terminal() -> None:
    out = io.StringIO()
    t = telemetrain.Telemetry(_identity(), store=False)
    t.add_sink(ConsoleSink(out, verbose=True), ranks="all")  # rank 3: the console is rank 0's unless asked
    ident = t.identity
    t.metric("loss", float("nan"), "train", unit="1", step=7)
    t.metric("big", float("-inf"), "train")
    t.event("checkpoint.saved", {"path": "a\nb", "bell": "\x07"}, severity="warning", group="ckpt")
    t.emit(SpanStart(10, 1_700_000_000_000_000_000, ident, "spans", "forward", "s1"))
    t.emit(SpanEnd(20, 1_700_000_000_000_000_010, ident, "spans", "forward", "s1", 2_500_000, "error", None, "Boom"))
    t.emit(StatWindow(30, 1_700_000_000_000_000_020, ident, "stats", "step_time", 0, 4, {"p50": 0.5}))
    t.emit(Diagnostic(40, 1_700_000_000_000_000_030, ident, "telemetrain", "dropped", "jsonl", 12, "queue full"))
    assert t.close()
    lines = _lines(out)
    assert len(lines) == 7  # the newline inside an attribute did not split its record
    assert ESC not in out.getvalue()  # a StringIO is no terminal: no colour
    assert all(" rank 3 " in line for line in lines)
    assert lines[0].endswith("train/loss = nan 1 step=7")
    assert lines[1].endswith("train/big = -inf")
    assert "ckpt/checkpoint.saved [warning]" in lines[2] and "path=a\\nb" in lines[2] and "bell=\\x07" in lines[2]
    assert "span> " in lines[3] and "forward" in lines[3]
    assert lines[4].endswith("forward 2.5 ms error error=Boom")
    assert lines[5].endswith("stats/step_time n=4 p50=0.5")
    assert lines[6].endswith("dropped sink=jsonl count=12 queue full")


def test_colour_on_a_real_terminal_and_never_with_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    leader, follower = pty.openpty()
    try:
        with os.fdopen(follower, "w", closefd=False) as tty:
            assert tty.isatty()
            t = telemetrain.Telemetry(_identity(), store=False)
            t.add_sink(ConsoleSink(tty), ranks="all")
            t.event("boom", severity="error")
            assert t.close()
            written = os.read(leader, 65536).decode()
        assert ESC + "31m" in written  # error severity in red
        assert "boom [error]" in written

        monkeypatch.setenv("NO_COLOR", "1")
        with os.fdopen(follower, "w", closefd=False) as tty:
            t = telemetrain.Telemetry(_identity(), store=False)
            t.add_sink(ConsoleSink(tty), ranks="all")
            t.event("calm")
            assert t.close()
            written = os.read(leader, 65536).decode()
        assert "calm [info]" in written and ESC not in written
    finally:
        os.close(leader)
        os.close(follower)


def test_console_env_switch_on_the_default_instance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """TELEMETRAIN_CONSOLE=1 gives the default instance a console sink on stderr (TELEMETRAIN_STORE=0: no files)."""
    monkeypatch.setenv("TELEMETRAIN_CONSOLE", "1")
    monkeypatch.setenv("TELEMETRAIN_STORE", "0")
    monkeypatch.chdir(tmp_path)
    telemetrain.reset()
    try:
        telemetrain.metric("hello", 1, "g")
        assert telemetrain.flush()
    finally:
        telemetrain.reset()
    assert "g/hello = 1" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_int_readings_are_grouped_as_floats_are_and_int_attributes_are_not() -> None:
    from telemetrain.identity import identity_from_env
    from telemetrain.records import MetricPoint
    from telemetrain.sinks.console import format_record

    ident = identity_from_env()
    memory = MetricPoint(0, 0, ident, "system", "process.memory.usage", 239_640_576, unit="By",
                         attributes={"process.pid": 24656})
    assert format_record(memory) == ("metric", "system/process.memory.usage = 239,640,576 By process.pid=24656")
    assert format_record(MetricPoint(0, 0, ident, "g", "n", 7, step=3)) == ("metric", "g/n = 7 step=3")
    # beyond a float's precision: no grouped binary noise (1e30 printed 1,000,000,000,000,000,019,884,624,838,656),
    # while an int stays exact however large
    assert format_record(MetricPoint(0, 0, ident, "g", "big", 1e30)) == ("metric", "g/big = 1e+30")
    assert format_record(MetricPoint(0, 0, ident, "g", "neg", -2.5e21)) == ("metric", "g/neg = -2.5e+21")
    huge = MetricPoint(0, 0, ident, "g", "n", 10**20 + 1, unit="By")
    assert format_record(huge) == ("metric", "g/n = 100,000,000,000,000,000,001 By")


def test_the_default_console_is_a_readable_progress_view(tmp_path: Path) -> None:
    """Rounded numbers, never a float's repr; one progress line per metrics report; what it says, or what is as
    frequent as iterations, left out; a failed iteration still shown."""
    from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

    out = io.StringIO()
    t = telemetrain.Telemetry(telemetrain.identity_from_env(env={}), store=False)
    t.add_sink(ConsoleSink(out))
    t.metric("val.loss", 0.010150554300000001, "eval", step=3)
    t.metric("step_time", 0.0123456, "train", unit="s")
    t.emit(StatWindow(30, 1_700_000_000_000_000_020, t.identity, "stats", "step_time", 0, 4,
                      {"mean": 0.0102090014, "p99": 0.010216454360000002, "count": 4}, "s"))
    config = TrainingTelemetryConfig(global_batch_size_or_fn=64, seq_length_or_fn=512, flops_per_sample_or_fn=6e6,
                                     peak_tflops_per_gpu=1.0, log_every_n_train_iterations=2,
                                     train_iterations_target_or_fn=4)
    r = TrainingRecorder(config, telemetry=t)
    ms = 1_700_000_000_000.0
    r.on_app_start(ms)
    r.on_train_start(0, start_time_msec=ms)
    for _ in range(4):
        r.on_training_single_iteration_start(ms)
        ms += 10.0
        r.on_training_single_iteration_end(ms)
    r.on_train_end(ms)
    r.on_app_end(ms)
    assert t.close()
    text = out.getvalue()
    assert "0.0101505543" not in text and "000000" not in text  # no raw float reprs
    lines = text.splitlines()
    assert any(line.endswith("eval/val.loss = 0.01015 step=3") for line in lines)
    assert any(line.endswith("train/step_time = 12.35 ms") for line in lines)
    assert any(line.endswith("stats/step_time n=4 mean=10.21 ms p99=10.22 ms count=4") for line in lines)
    progress = [line.split(" train  ", 1)[1] for line in lines if " train  " in line]
    assert progress == [
        "step 2/4 (50%)  6400 samples/s  3,276,800 tokens/s  iteration p50 10 ms p99 10 ms  0.0384 TFLOP/s per GPU  "
        "MFU 3.8%",
        "step 4/4 (100%)  6400 samples/s  3,276,800 tokens/s  iteration p50 10 ms p99 10 ms  0.0384 TFLOP/s per GPU  "
        "MFU 3.8%",
    ]
    assert "span>" not in text and "training_single_iteration" not in text  # no span starts, no iteration ends
    assert "train.samples_per_second" not in text  # the derived metrics: said by the progress line
    assert any("span<  training_loop 40 ms ok" in line for line in lines)
