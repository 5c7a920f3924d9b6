"""``telemetrain.metrics`` against the real ``torch.distributed.elastic.metrics``, side by side.

torchelastic keeps its handlers in module globals; the ``torch_metrics`` fixture swaps them for fresh ones per test
(and monkeypatch puts the originals back), so both libraries start each test with the default null handler.
"""

from __future__ import annotations

import inspect
import math
import re
import time
import types
import warnings
from typing import Any

import pytest
import torch.distributed.elastic.metrics as tmetrics
import torch.distributed.elastic.metrics.api as tapi

import telemetrain
from conftest import norm_type, recorder, run_dir_of
from telemetrain import metrics

# -- helpers ---------------------------------------------------------------------------------------------------------


def triples(data: list[Any]) -> list[tuple[str, str, Any]]:
    """(group, name, value) of each MetricData; a duration's value becomes its type (it varies between runs)."""
    return [
        (d.group_name, d.name, type(d.value).__name__ if d.name.endswith(".duration.ms") else d.value) for d in data
    ]


def stored_metrics(read_run: Any, t: telemetrain.Telemetry) -> list[tuple[str, str, Any]]:
    return [
        (r.group, r.name, type(r.value).__name__ if r.name.endswith(".duration.ms") else r.value)
        for r in read_run(t, "metric")
    ]


def _params(fn: Any) -> list[tuple[str, Any, Any, Any]]:
    sig = inspect.signature(fn, eval_str=True)
    return [
        (
            p.name,
            p.kind,
            p.default,
            inspect.Parameter.empty if p.annotation is inspect.Parameter.empty else norm_type(p.annotation),
        )
        for p in sig.parameters.values()
    ]


# Deliberately widened (docs/compat.md): torchelastic annotates ``metric_value: int`` but passes anything through;
# telemetrain accepts any real number, and ``float`` (which admits ``int``) says so to a type checker.
WIDENED = {("metric_value", "int"): "float"}


def assert_same_parameters(ours: Any, theirs: Any) -> None:
    """Same names, kinds and defaults; the same annotation wherever torchelastic has one (ours may add some, and may
    widen the ones listed in WIDENED)."""
    mine, their = _params(ours), _params(theirs)
    assert [p[:3] for p in mine] == [p[:3] for p in their]
    for m, th in zip(mine, their, strict=True):
        if th[3] is not inspect.Parameter.empty:
            assert m[3] == WIDENED.get((th[0], th[3]), th[3]), f"annotation of {th[0]!r}"


# -- public names and signatures -------------------------------------------------------------------------------------


def test_every_torchelastic_name_exists() -> None:
    for name in [*tapi.__all__, "initialize_metrics"]:
        assert hasattr(metrics, name), name
        assert name in metrics.__all__, name


@pytest.mark.parametrize(
    "name",
    [
        "put_metric",
        "configure",
        "getStream",
        "prof",
        "profile",
        "publish_metric",
        "get_elapsed_time_ms",
        "initialize_metrics",
    ],
)
def test_function_signatures_match(name: str) -> None:
    assert_same_parameters(getattr(metrics, name), getattr(tmetrics, name))


def test_metric_stream_signatures_match() -> None:
    assert_same_parameters(metrics.MetricStream.__init__, tapi.MetricStream.__init__)
    assert_same_parameters(metrics.MetricStream.add_value, tapi.MetricStream.add_value)
    assert_same_parameters(metrics.MetricHandler.emit, tapi.MetricHandler.emit)


def test_metric_data_and_config_shapes_match() -> None:
    assert metrics.MetricData._fields == tapi.MetricData._fields == ("timestamp", "group_name", "name", "value")
    assert metrics.MetricsConfig.__slots__ == tapi.MetricsConfig.__slots__ == ["params"]
    assert_same_parameters(metrics.MetricsConfig.__init__, tapi.MetricsConfig.__init__)
    for cls in (metrics.MetricsConfig, tapi.MetricsConfig):
        assert cls().params == {}
        assert cls({"a": "b"}).params == {"a": "b"}
        with pytest.raises(AttributeError):
            cls().other = 1  # type: ignore[union-attr]
    assert inspect.isabstract(metrics.MetricHandler)
    with pytest.raises(TypeError):
        metrics.MetricHandler()  # type: ignore[abstract]


def test_initialize_metrics_is_a_noop(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    assert metrics.initialize_metrics() is None  # type: ignore[func-returns-value]
    assert metrics.initialize_metrics(metrics.MetricsConfig({"k": "v"})) is None  # type: ignore[func-returns-value]
    telemetry.metric("marker", 1)
    assert [r.name for r in read_run(telemetry)] == ["marker"]


def test_get_elapsed_time_ms_reads_the_wall_clock(torch_metrics: types.ModuleType) -> None:
    start = time.time() - 5.0
    ours, theirs = metrics.get_elapsed_time_ms(start), torch_metrics.get_elapsed_time_ms(start)
    assert type(ours) is int and type(theirs) is int
    assert ours >= 5000 and theirs >= 5000


# -- torchelastic's documented examples, import swapped --------------------------------------------------------------


def _stdout_handler_example(lib: types.ModuleType) -> None:
    """The torchelastic metrics module docstring example, verbatim but for the module it uses."""

    class StdoutMetricHandler(lib.MetricHandler):  # type: ignore[name-defined, misc]
        def emit(self, metric_data: Any) -> None:
            print(f"[{metric_data.timestamp}][{metric_data.group_name}]: {metric_data.name}={metric_data.value}")

    lib.configure(StdoutMetricHandler(), "my_module")
    lib.put_metric("foobar", 1, "my_module")


LINE = re.compile(r"^\[(?P<ts>\d+\.\d+)\]\[my_module\]: foobar=1$")


def test_stdout_handler_example_runs_unchanged(
    telemetry: telemetrain.Telemetry, torch_metrics: types.ModuleType, capsys: pytest.CaptureFixture[str], read_run: Any
) -> None:
    _stdout_handler_example(torch_metrics)
    theirs = capsys.readouterr().out.splitlines()
    _stdout_handler_example(metrics)
    ours = capsys.readouterr().out.splitlines()
    assert len(theirs) == len(ours) == 1
    m_theirs, m_ours = LINE.match(theirs[0]), LINE.match(ours[0])
    assert m_theirs and m_ours, (theirs, ours)
    # the timestamp is wall-clock seconds, as time.time() gives it
    assert abs(float(m_ours["ts"]) - time.time()) < 600
    assert [(r.group, r.name, r.value) for r in read_run(telemetry, "metric")] == [("my_module", "foobar", 1)]


def test_console_handler_prints_exactly_as_torchelastic(
    telemetry: telemetrain.Telemetry, capsys: pytest.CaptureFixture[str]
) -> None:
    for args in [
        (1712345678.123456, "torchelastic", "agent.restart", 3),
        (1.5, "g", "loss", 0.25),
        (0.0, "g", "x", float("nan")),
        (2.0, "g", "x", True),
    ]:
        tapi.ConsoleMetricHandler().emit(tapi.MetricData(*args))
        theirs = capsys.readouterr().out
        metrics.ConsoleMetricHandler().emit(metrics.MetricData(*args))
        ours = capsys.readouterr().out
        assert ours == theirs
        assert ours.count("\n") == 1


def test_console_handler_through_put_metric_prints_torchelastic_format(
    telemetry: telemetrain.Telemetry, torch_metrics: types.ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    torch_metrics.configure(torch_metrics.ConsoleMetricHandler(), "g")
    torch_metrics.put_metric("steps", 42, "g")
    theirs = capsys.readouterr().out
    metrics.configure(metrics.ConsoleMetricHandler(), "g")
    metrics.put_metric("steps", 42, "g")
    ours = capsys.readouterr().out
    strip = re.compile(r"^\[[0-9.]+\]")
    assert strip.sub("[T]", ours) == strip.sub("[T]", theirs) == "[T][g]: steps=42\n"


# -- @prof -----------------------------------------------------------------------------------------------------------


def work(x: int) -> int:
    return x * 2


def failing_work() -> None:
    raise ValueError("bad step")


def interrupted_work() -> None:
    raise KeyboardInterrupt


class Trainer:
    def step(self, n: int) -> int:
        return n + 1

    ours_step = metrics.prof(step)
    torch_step = tmetrics.prof(step)


class Parent:
    def func(self) -> str:
        return "parent"

    ours_func = metrics.prof(func)
    torch_func = tmetrics.prof(func)


class Child(Parent):
    def func(self) -> str:  # an override the decorated Parent.func does not see
        return "child"


def _run_side_by_side(
    torch_lib: types.ModuleType, call: Any, group: str | None = None
) -> tuple[list[tuple[str, str, Any]], list[tuple[str, str, Any]]]:
    """Run ``call(lib)`` with a recording handler on each library; returns (ours, theirs) as triples."""
    ours_h, theirs_h = recorder(metrics.MetricHandler), recorder(tapi.MetricHandler)
    metrics.configure(ours_h, group)
    torch_lib.configure(theirs_h, group)
    call("torch")
    call("ours")
    return triples(ours_h.data), triples(theirs_h.data)


def test_prof_module_function(telemetry: telemetrain.Telemetry, torch_metrics: types.ModuleType, read_run: Any) -> None:
    ours_work, torch_work = metrics.prof(work), torch_metrics.prof(work)
    results = {}

    def call(which: str) -> None:
        results[which] = (ours_work if which == "ours" else torch_work)(21)

    ours, theirs = _run_side_by_side(torch_metrics, call)
    assert results == {"ours": 42, "torch": 42}
    assert (
        ours
        == theirs
        == [
            ("torchelastic", "test_metrics_compat.work.success", 1),
            ("torchelastic", "test_metrics_compat.work.duration.ms", "int"),
        ]
    )
    assert stored_metrics(read_run, telemetry) == ours
    assert ours_work.__name__ == "work" and ours_work.__wrapped__ is work  # type: ignore[attr-defined]  # functools.wraps, as torchelastic


def test_prof_method_uses_class_qualname(telemetry: telemetrain.Telemetry, torch_metrics: types.ModuleType) -> None:
    trainer = Trainer()

    def call(which: str) -> None:
        assert (trainer.ours_step if which == "ours" else trainer.torch_step)(1) == 2

    ours, theirs = _run_side_by_side(torch_metrics, call)
    assert (
        ours
        == theirs
        == [
            ("torchelastic", "Trainer.step.success", 1),
            ("torchelastic", "Trainer.step.duration.ms", "int"),
        ]
    )


def test_prof_failure_is_counted_and_reraised(
    telemetry: telemetrain.Telemetry, torch_metrics: types.ModuleType, read_run: Any
) -> None:
    ours_fail, torch_fail = metrics.prof(failing_work), torch_metrics.prof(failing_work)

    def call(which: str) -> None:
        with pytest.raises(ValueError, match="bad step"):
            (ours_fail if which == "ours" else torch_fail)()

    ours, theirs = _run_side_by_side(torch_metrics, call)
    assert (
        ours
        == theirs
        == [
            ("torchelastic", "test_metrics_compat.failing_work.failure", 1),
            ("torchelastic", "test_metrics_compat.failing_work.duration.ms", "int"),
        ]
    )
    assert stored_metrics(read_run, telemetry) == ours


def test_prof_base_exception_records_duration_only(
    telemetry: telemetrain.Telemetry, torch_metrics: types.ModuleType
) -> None:
    ours_int, torch_int = metrics.prof(interrupted_work), torch_metrics.prof(interrupted_work)

    def call(which: str) -> None:
        with pytest.raises(KeyboardInterrupt):
            (ours_int if which == "ours" else torch_int)()

    ours, theirs = _run_side_by_side(torch_metrics, call)
    assert ours == theirs == [("torchelastic", "test_metrics_compat.interrupted_work.duration.ms", "int")]


def test_prof_durations_are_non_negative_ints(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    wrapped = metrics.prof(work)
    for i in range(3):
        wrapped(i)
    durations = [r.value for r in read_run(telemetry, "metric") if r.name.endswith(".duration.ms")]
    assert len(durations) == 3
    assert all(type(d) is int and d >= 0 for d in durations)


def test_prof_with_group_routes_to_that_group(
    telemetry: telemetrain.Telemetry, torch_metrics: types.ModuleType, read_run: Any
) -> None:
    ours_default, ours_agent = recorder(metrics.MetricHandler), recorder(metrics.MetricHandler)
    theirs_default, theirs_agent = recorder(tapi.MetricHandler), recorder(tapi.MetricHandler)
    metrics.configure(ours_default)
    metrics.configure(ours_agent, "agent")
    torch_metrics.configure(theirs_default)
    torch_metrics.configure(theirs_agent, "agent")

    @metrics.prof(group="agent")
    def ours_rendezvous() -> None:
        pass

    @torch_metrics.prof(group="agent")  # type: ignore[untyped-decorator]  # (torch's: unannotated)
    def torch_rendezvous() -> None:
        pass

    ours_rendezvous()
    torch_rendezvous()
    assert ours_default.data == [] and theirs_default.data == []
    ours = triples(ours_agent.data)
    theirs = triples(theirs_agent.data)
    key = "test_prof_with_group_routes_to_that_group.<locals>"
    assert ours == [
        ("agent", f"{key}.ours_rendezvous.success", 1),
        ("agent", f"{key}.ours_rendezvous.duration.ms", "int"),
    ]
    assert [(g, n.replace("torch_", "ours_"), v) for g, n, v in theirs] == ours
    assert stored_metrics(read_run, telemetry) == ours


def test_prof_keeps_the_defining_class_name_on_a_subclass(
    telemetry: telemetrain.Telemetry, torch_metrics: types.ModuleType
) -> None:
    child = Child()

    def call(which: str) -> None:
        assert (child.ours_func if which == "ours" else child.torch_func)() == "parent"

    ours, theirs = _run_side_by_side(torch_metrics, call)
    assert (
        ours
        == theirs
        == [
            ("torchelastic", "Parent.func.success", 1),
            ("torchelastic", "Parent.func.duration.ms", "int"),
        ]
    )


# -- _get_metric_name --------------------------------------------------------------------------------------------------


def _nested() -> Any:
    def inner() -> None:
        pass

    return inner


def _moduleless() -> Any:
    def fn() -> None:
        pass

    fn.__qualname__ = "fn"
    fn.__module__ = None  # type: ignore[assignment]
    return fn


@pytest.mark.parametrize(
    "fn",
    [work, Trainer.step, Trainer().step, Child.func, _nested(), _moduleless(), metrics.put_metric, tmetrics.put_metric],
    ids=["module-function", "method", "bound-method", "subclass-method", "nested", "no-module", "ours", "torch"],
)
def test_get_metric_name_matches_torchelastic(fn: Any) -> None:
    assert metrics._get_metric_name(fn) == tapi._get_metric_name(fn)  # type: ignore[no-untyped-call]


def test_get_metric_name_values() -> None:
    assert metrics._get_metric_name(work) == "test_metrics_compat.work"
    assert metrics._get_metric_name(Trainer.step) == "Trainer.step"
    assert metrics._get_metric_name(_nested()) == "_nested.<locals>.inner"


# -- configure / getStream / group routing -----------------------------------------------------------------------------


def test_group_handler_overrides_default_handler(
    telemetry: telemetrain.Telemetry, torch_metrics: types.ModuleType, read_run: Any
) -> None:
    sides = {}
    for name, lib, base in [("ours", metrics, metrics.MetricHandler), ("torch", torch_metrics, tapi.MetricHandler)]:
        default, g = recorder(base), recorder(base)
        lib.configure(default, None)
        lib.configure(g, "g")
        lib.put_metric("a", 1, "g")
        lib.put_metric("b", 2, "other")
        lib.put_metric("c", 3)  # the default group, torchelastic
        sides[name] = (triples(default.data), triples(g.data))
    assert sides["ours"] == sides["torch"]
    assert sides["ours"] == ([("other", "b", 2), ("torchelastic", "c", 3)], [("g", "a", 1)])
    assert [(r.group, r.name, r.value) for r in read_run(telemetry, "metric")] == [
        ("g", "a", 1),
        ("other", "b", 2),
        ("torchelastic", "c", 3),
    ]


def test_null_handler_silences_only_its_group(
    telemetry: telemetrain.Telemetry, torch_metrics: types.ModuleType, read_run: Any
) -> None:
    sides = {}
    for name, lib, base in [("ours", metrics, metrics.MetricHandler), ("torch", torch_metrics, tapi.MetricHandler)]:
        default = recorder(base)
        lib.configure(default)
        lib.configure(lib.NullMetricHandler(), "g")
        lib.put_metric("silenced", 1, "g")
        lib.put_metric("heard", 2, "h")
        sides[name] = triples(default.data)
    assert sides["ours"] == sides["torch"] == [("h", "heard", 2)]
    # the handler is silenced, not the native pipeline
    assert [(r.group, r.name) for r in read_run(telemetry, "metric")] == [("g", "silenced"), ("h", "heard")]


def test_reconfiguring_a_group_replaces_its_handler(telemetry: telemetrain.Telemetry) -> None:
    first, second = recorder(metrics.MetricHandler), recorder(metrics.MetricHandler)
    metrics.configure(first, "g")
    metrics.put_metric("a", 1, "g")
    metrics.configure(second, "g")
    metrics.put_metric("b", 2, "g")
    assert triples(first.data) == [("g", "a", 1)]
    assert triples(second.data) == [("g", "b", 2)]


def test_get_stream_add_value(telemetry: telemetrain.Telemetry, torch_metrics: types.ModuleType, read_run: Any) -> None:
    ours_g, theirs_g = recorder(metrics.MetricHandler), recorder(tapi.MetricHandler)
    metrics.configure(ours_g, "g")
    torch_metrics.configure(theirs_g, "g")
    ours_stream, theirs_stream = metrics.getStream("g"), torch_metrics.getStream("g")
    assert isinstance(ours_stream, metrics.MetricStream)
    assert ours_stream.group_name == theirs_stream.group_name == "g"
    assert ours_stream.handler is ours_g and theirs_stream.handler is theirs_g
    ours_stream.add_value("tokens", 128)
    theirs_stream.add_value("tokens", 128)
    # (ours_g: a recorder; the `is` above narrowed it to MetricHandler, which has no .data)
    assert triples(ours_g.data) == triples(theirs_g.data) == [("g", "tokens", 128)]  # type: ignore[attr-defined]
    assert abs(ours_g.data[0].timestamp - time.time()) < 600  # type: ignore[attr-defined]
    assert [(r.group, r.name, r.value) for r in read_run(telemetry, "metric")] == [("g", "tokens", 128)]


def test_hand_built_stream_emits_to_its_own_handler(
    telemetry: telemetrain.Telemetry, torch_metrics: types.ModuleType, read_run: Any
) -> None:
    ours_g, ours_other = recorder(metrics.MetricHandler), recorder(metrics.MetricHandler)
    theirs_g, theirs_other = recorder(tapi.MetricHandler), recorder(tapi.MetricHandler)
    metrics.configure(ours_g, "g")
    torch_metrics.configure(theirs_g, "g")
    metrics.MetricStream("g", ours_other).add_value("n", 3)
    tapi.MetricStream("g", theirs_other).add_value("n", 3)
    assert triples(ours_other.data) == triples(theirs_other.data) == [("g", "n", 3)]
    assert ours_g.data == [] and theirs_g.data == []
    assert [(r.group, r.name, r.value) for r in read_run(telemetry, "metric")] == [("g", "n", 3)]


def test_get_stream_returns_a_handler_that_is_falsy(
    telemetry: telemetrain.Telemetry, torch_metrics: types.ModuleType
) -> None:
    """A handler that is also a collection is falsy while empty; torchelastic still picks it for its group."""

    def sized(base: type) -> Any:
        class SizedRecorder(base):  # type: ignore[misc]
            def __init__(self) -> None:
                self.data: list[Any] = []

            def emit(self, metric_data: Any) -> None:
                self.data.append(metric_data)

            def __len__(self) -> int:
                return len(self.data)

        return SizedRecorder()

    ours_default, theirs_default = recorder(metrics.MetricHandler), recorder(tapi.MetricHandler)
    ours_g, theirs_g = sized(metrics.MetricHandler), sized(tapi.MetricHandler)
    metrics.configure(ours_default)
    metrics.configure(ours_g, "g")
    torch_metrics.configure(theirs_default)
    torch_metrics.configure(theirs_g, "g")
    assert torch_metrics.getStream("g").handler is theirs_g
    assert metrics.getStream("g").handler is ours_g
    metrics.put_metric("x", 1, "g")
    torch_metrics.put_metric("x", 1, "g")
    assert triples(ours_g.data) == triples(theirs_g.data) == [("g", "x", 1)]  # type: ignore[attr-defined]  # (narrowed by `is`)
    assert ours_default.data == theirs_default.data == []


def test_configure_rejects_a_non_handler(telemetry: telemetrain.Telemetry) -> None:
    with pytest.raises(TypeError, match="MetricHandler"):
        metrics.configure(object())  # type: ignore[arg-type]


# -- deprecated names ------------------------------------------------------------------------------------------------


def test_publish_metric_warns_and_publishes(
    telemetry: telemetrain.Telemetry, torch_metrics: types.ModuleType, read_run: Any
) -> None:
    ours_h, theirs_h = recorder(metrics.MetricHandler), recorder(tapi.MetricHandler)
    metrics.configure(ours_h, "g")
    torch_metrics.configure(theirs_h, "g")
    with pytest.warns(FutureWarning):
        torch_metrics.publish_metric("g", "n", 5)
    with pytest.warns(FutureWarning, match="put_metric"):
        metrics.publish_metric("g", "n", 5)
    assert triples(ours_h.data) == triples(theirs_h.data) == [("g", "n", 5)]
    assert [(r.group, r.name, r.value) for r in read_run(telemetry, "metric")] == [("g", "n", 5)]


def test_profile_warns_and_emits_like_torchelastic(
    telemetry: telemetrain.Telemetry, torch_metrics: types.ModuleType
) -> None:
    ours_h, theirs_h = recorder(metrics.MetricHandler), recorder(tapi.MetricHandler)
    metrics.configure(ours_h, "g")
    torch_metrics.configure(theirs_h, "g")
    with pytest.warns(FutureWarning):
        torch_deco = torch_metrics.profile("g")
    with pytest.warns(FutureWarning, match="prof"):
        ours_deco = metrics.profile("g")
    ours_work, torch_work = ours_deco(work), torch_deco(work)
    ours_fail, torch_fail = ours_deco(failing_work), torch_deco(failing_work)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # every call publishes through publish_metric
        assert torch_work(2) == ours_work(2) == 4
        with pytest.raises(ValueError):
            torch_fail()
        with pytest.raises(ValueError):
            ours_fail()
    assert (
        triples(ours_h.data)
        == triples(theirs_h.data)
        == [
            ("g", "work.success", 1),
            ("g", "work.duration.ms", "int"),
            ("g", "failing_work.failure", 1),
            ("g", "failing_work.duration.ms", "int"),
        ]
    )


# -- the native pipeline -----------------------------------------------------------------------------------------------


def test_every_put_metric_reaches_the_run_store(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    h = recorder(metrics.MetricHandler)
    metrics.configure(h, "with_handler")
    metrics.put_metric("a", 1)
    metrics.put_metric("b", 2.5, "with_handler")
    metrics.put_metric("c", -3, "no_handler")
    records = read_run(telemetry, "metric")
    assert [(r.group, r.name, r.value) for r in records] == [
        ("torchelastic", "a", 1),
        ("with_handler", "b", 2.5),
        ("no_handler", "c", -3),
    ]
    assert all(r.identity == telemetry.identity for r in records)
    assert all(r.kind == "metric" and r.unit == "" and r.step is None for r in records)
    assert triples(h.data) == [("with_handler", "b", 2.5)]
    # the handler sees the time the record carries
    assert h.data[0].timestamp == records[1].wall_ns / 1e9


def test_put_metric_carries_a_custom_identity(tmp_path: Any, read_run: Any) -> None:
    identity = telemetrain.identity_from_env(env={}, rank=2, world_size=4, local_rank=2, run_id="idrun")
    t = telemetrain.Telemetry(identity, store=tmp_path)
    telemetrain.set_telemetry(t)
    try:
        metrics.put_metric("x", 1, "g")
        (rec,) = read_run(t, "metric")
        assert rec.identity == identity
        assert (rec.identity.rank, rec.identity.world_size, rec.identity.run_id) == (2, 4, "idrun")
        assert run_dir_of(t).name == "idrun"
    finally:
        telemetrain.reset()


# -- bad input -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["1", None, object(), [1], b"1"], ids=["str", "None", "object", "list", "bytes"])
def test_put_metric_rejects_non_numbers(telemetry: telemetrain.Telemetry, value: Any) -> None:
    with pytest.raises(TypeError, match="metric_value"):
        metrics.put_metric("x", value, "g")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_put_metric_stores_non_finite_values(telemetry: telemetrain.Telemetry, read_run: Any, value: float) -> None:
    h = recorder(metrics.MetricHandler)
    metrics.configure(h, "g")
    metrics.put_metric("loss", value, "g")
    (rec,) = read_run(telemetry, "metric")
    assert (rec.group, rec.name) == ("g", "loss")
    assert type(rec.value) is float
    if math.isnan(value):
        assert math.isnan(rec.value) and math.isnan(h.data[0].value)
    else:
        assert rec.value == value == h.data[0].value


def test_put_metric_accepts_bool(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    metrics.put_metric("flag", True, "g")
    metrics.put_metric("flag", False, "g")
    assert [r.value for r in read_run(telemetry, "metric")] == [1, 0]


def test_put_metric_rejects_bad_names(telemetry: telemetrain.Telemetry) -> None:
    with pytest.raises(ValueError, match="metric_name"):
        metrics.put_metric("", 1, "g")
    with pytest.raises(TypeError, match="metric_name"):
        metrics.put_metric(5, 1, "g")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="metric_name"):
        metrics.put_metric(None, 1, "g")  # type: ignore[arg-type]


@pytest.mark.parametrize("group", [1, None, ["g"], 1.5, b"g"], ids=["int", "None", "list", "float", "bytes"])
def test_put_metric_rejects_non_str_groups(telemetry: telemetrain.Telemetry, group: Any) -> None:
    with pytest.raises(TypeError, match="metric_group"):
        metrics.put_metric("x", 1, group)


def test_put_metric_rejects_empty_group(telemetry: telemetrain.Telemetry) -> None:
    with pytest.raises(ValueError, match="metric_group"):
        metrics.put_metric("x", 1, "")


def test_nothing_is_written_for_rejected_input(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    for bad in [("x", "1", "g"), ("", 1, "g"), ("x", 1, "")]:
        with pytest.raises((TypeError, ValueError)):
            metrics.put_metric(*bad)  # type: ignore[arg-type]
    metrics.put_metric("ok", 1, "g")
    assert [(r.group, r.name, r.value) for r in read_run(telemetry)] == [("g", "ok", 1)]


# -- containment and muting ------------------------------------------------------------------------------------------


class RaisingHandler(metrics.MetricHandler):
    def emit(self, metric_data: Any) -> None:
        raise RuntimeError("handler is broken")


def test_raising_handler_is_contained(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    metrics.configure(RaisingHandler(), "g")
    with pytest.warns(telemetrain.TelemetryWarning, match="handler is broken"):
        metrics.put_metric("x", 7, "g")
    metrics.put_metric("y", 8, "g")  # still no exception, and no second warning needed
    health = telemetry.health()
    assert health["failed"] == 2
    (hook_stats,) = [s for s in health["sinks"] if s["failed"]]
    assert "handler is broken" in hook_stats["last_error"]
    records = read_run(telemetry)
    assert [(r.name, r.value) for r in records if r.kind == "metric"] == [("x", 7), ("y", 8)]
    diagnostics = [r for r in records if r.kind == "diagnostic"]
    assert diagnostics and diagnostics[0].name == "sink_error"
    assert "handler is broken" in diagnostics[0].message


def test_raising_prof_handler_does_not_change_the_result(telemetry: telemetrain.Telemetry) -> None:
    metrics.configure(RaisingHandler())
    with pytest.warns(telemetrain.TelemetryWarning):
        assert metrics.prof(work)(5) == 10
    assert telemetry.health()["failed"] == 2  # .success and .duration.ms


def test_muted_group_records_nothing(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    telemetry.mute("quiet")
    metrics.put_metric("x", 1, "quiet")
    metrics.put_metric("x", "not checked: nobody listens", "quiet")  # type: ignore[arg-type]  # off is free: no check either
    metrics.prof(group="quiet")(work)(1)
    metrics.put_metric("y", 2, "loud")
    assert not telemetry.listening("metric", "quiet")
    assert [(r.group, r.name) for r in read_run(telemetry)] == [("loud", "y")]


def test_muted_group_does_not_reach_metric_handlers(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    default, quiet = recorder(metrics.MetricHandler), recorder(metrics.MetricHandler)
    metrics.configure(default)
    metrics.configure(quiet, "quiet")
    telemetry.mute("quiet", "other_quiet")
    metrics.put_metric("x", 1, "quiet")
    metrics.put_metric("x", 1, "other_quiet")
    assert quiet.data == [] and default.data == []
    assert not telemetry.listening("metric", "quiet")
    telemetry.unmute("quiet")
    metrics.put_metric("x", 2, "quiet")
    assert triples(quiet.data) == [("quiet", "x", 2)]
    assert [(r.group, r.value) for r in read_run(telemetry)] == [("quiet", 2)]


def test_unlistened_group_skips_checks(tmp_path: Any) -> None:
    t = telemetrain.Telemetry(store=False)
    telemetrain.set_telemetry(t)
    try:
        assert not t.listening("metric", "nobody")
        metrics.put_metric("x", "not a number", "nobody")  # type: ignore[arg-type]  # documented: returns before any check
        h = recorder(metrics.MetricHandler)
        metrics.configure(h, "somebody")
        with pytest.raises(TypeError, match="metric_value"):
            metrics.put_metric("x", "not a number", "somebody")  # type: ignore[arg-type]
        metrics.put_metric("x", 1, "somebody")
        assert triples(h.data) == [("somebody", "x", 1)]
    finally:
        telemetrain.reset()


def test_closed_default_records_nothing(telemetry: telemetrain.Telemetry, read_run: Any) -> None:
    h = recorder(metrics.MetricHandler)
    metrics.configure(h)
    metrics.put_metric("before", 1)
    records = read_run(telemetry)
    telemetry.close()
    metrics.put_metric("after", 2)
    metrics.prof(work)(1)
    assert triples(h.data) == [("torchelastic", "before", 1)]
    assert [r.name for r in records] == ["before"]
    assert [r.name for r in open_run_records(telemetry)] == ["before"]


def open_run_records(t: telemetrain.Telemetry) -> list[Any]:
    return telemetrain.store.open_run(run_dir_of(t)).records()
