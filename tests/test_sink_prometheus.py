"""The Prometheus sink: names and mapping, a real Prometheus server scraping it, and its failure modes."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prometheus_client", reason="needs the prometheus extra: pip install 'telemetrain[prometheus]'")

from prometheus_client.parser import text_string_to_metric_families

from conftest import run_dir_of
from telemetrain import Telemetry
from telemetrain.identity import identity_from_env
from telemetrain.records import MetricPoint
from telemetrain.sinks.prometheus import PrometheusSink, metric_name
from telemetrain.stats import Stat
from telemetrain.store import open_run
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

PROMETHEUS = shutil.which("prometheus") or ("/usr/bin/prometheus" if os.path.exists("/usr/bin/prometheus") else None)
WAIT_S = 30.0
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # local servers: never through a proxy
IDENTITY: dict[str, Any] = {"run_id": "run-a", "session_tag": "sess-a", "perf_tag": "bs32", "rank": 0, "local_rank": 0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, list[Any]]:
    """{sample name: [(labels, value), ...]} from the sink's endpoint, parsed by prometheus_client's own parser."""
    text = OPENER.open(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def only(samples: dict[str, list[Any]], name: str) -> float:
    (entry,) = samples[name]
    return float(entry[1])


# -- a real Prometheus server ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def prometheus_server(tmp_path: Path, *target_ports: int, honor_labels: bool = False) -> Iterator[str]:
    """Start Debian's ``prometheus`` scraping 127.0.0.1:<each target port> every second; yield its base URL.
    ``honor_labels``: as the docs configure a Pushgateway's scrape."""
    assert PROMETHEUS is not None
    config = tmp_path / "prometheus.yml"
    targets = ", ".join(f"'127.0.0.1:{port}'" for port in target_ports)
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: telemetrain\n"
        + ("    honor_labels: true\n" if honor_labels else "")
        + f"    static_configs:\n      - targets: [{targets}]\n"
    )
    port = free_port()
    with _serve([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{port}"], port, tmp_path / "prometheus.log") as base:
        yield base


@contextlib.contextmanager
def _serve(argv: list[str], port: int, log_path: Path) -> Iterator[str]:
    """Run a Prometheus-family server (``argv``, listening on 127.0.0.1:``port``) until its ``/-/ready`` answers;
    yield its base URL; stop it after."""
    log = open(log_path, "wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                if OPENER.open(base + "/-/ready", timeout=2).status == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                pytest.fail(f"{Path(argv[0]).name} did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def query(base: str, promql: str) -> list[Any]:
    url = f"{base}/api/v1/query?query={urllib.parse.quote(promql)}"
    body = json.loads(OPENER.open(url, timeout=10).read())
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def wait_for(base: str, promql: str) -> list[Any]:
    """Poll until the query returns a series (bounded: a broken exporter fails here, it does not hang)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        result = query(base, promql)
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"no series for {promql!r} within {WAIT_S} s")
        time.sleep(0.25)


# -- names ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "unit", "expected"),
    [
        ("loss", "", "telemetrain_loss"),
        ("train.iteration_time.p99", "s", "telemetrain_train_iteration_time_p99_seconds"),
        ("train.samples_per_second", "1/s", "telemetrain_train_samples_per_second"),
        ("train.mfu", "1", "telemetrain_train_mfu_ratio"),
        ("train.flops_per_gpu", "{flop}/s", "telemetrain_train_flops_per_gpu_per_second"),
        ("train.tflops_per_gpu", "TFLOP/s", "telemetrain_train_tflops_per_gpu"),  # not UCUM: no suffix
        ("data.wait", "ms", "telemetrain_data_wait_seconds"),  # base units: served in seconds
        ("checkpoint.size", "MiBy", "telemetrain_checkpoint_size_bytes"),
        ("io.rate", "By/s", "telemetrain_io_rate_bytes_per_second"),
        ("system.disk.io", "By", "system_disk_io_bytes"),
        ("system.memory.usage", "By", "system_memory_usage_bytes"),
        ("process.cpu.time", "s", "process_cpu_time_seconds"),
        ("hw.energy", "J", "hw_energy_joules"),
        ("hw.gpu.utilization", "1", "hw_gpu_utilization_ratio"),
        ("hw.temperature", "Cel", "hw_temperature_celsius"),
        ("process.thread.count", "{thread}", "process_thread_count"),
        ("torch.cuda.memory.allocated", "By", "telemetrain_torch_cuda_memory_allocated_bytes"),
        ("telemetrain.queue.depth", "", "telemetrain_queue_depth"),
        ("step_seconds", "s", "telemetrain_step_seconds"),
        ("9lives-and spaces", "", "telemetrain__9lives_and_spaces"),
    ],
)
def test_metric_names(name: str, unit: str, expected: str) -> None:
    assert metric_name(name, unit) == expected
    if expected.startswith("telemetrain_"):  # (a semantic convention's name with _total is another, ours, name)
        assert metric_name(name + "_total", unit, counter=True) == expected  # a counter's _total: once, added last
    assert re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", expected)


def test_import_without_prometheus_client_names_the_extra() -> None:
    code = "import sys; sys.modules['prometheus_client'] = None; import telemetrain.sinks.prometheus"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "ImportError: telemetrain.sinks.prometheus needs prometheus_client" in proc.stderr
    assert "pip install 'telemetrain[prometheus]'" in proc.stderr


def test_bad_arguments_raise_at_once() -> None:
    with pytest.raises(ValueError, match="port"):
        PrometheusSink(port=70000)
    with pytest.raises(ValueError, match="local_rank"):
        PrometheusSink(local_rank=-1)
    with pytest.raises(TypeError, match="addr"):
        PrometheusSink(port=0, addr="")
    with pytest.raises(ValueError, match="max_series"):
        PrometheusSink(port=0, max_series=0)


# -- the endpoint -----------------------------------------------------------------------------------------------------


def test_binds_loopback_by_default_and_the_port_follows_local_rank() -> None:
    sink = PrometheusSink(port=0)
    try:
        assert sink.address is not None and sink.address[0] == "127.0.0.1"
        assert sink.port == sink.address[1] and sink.port != 0
    finally:
        sink.close()
    assert not sink.serving and sink.port is None
    port = free_port()
    sink = PrometheusSink(base_port=port - 3, local_rank=3)
    try:
        assert sink.port == port and sink.address == ("127.0.0.1", port)
    finally:
        sink.close()
    with pytest.raises(urllib.error.URLError) as refused:
        OPENER.open(f"http://127.0.0.1:{port}/metrics", timeout=5)
    assert isinstance(refused.value.reason, ConnectionRefusedError)


def test_mapping_on_the_endpoint(tmp_path: Path) -> None:
    t = Telemetry(identity_from_env(**IDENTITY), store=False)
    sink = PrometheusSink(port=0, counters=["tokens.seen"])
    t.add_sink(sink)
    try:
        t.metric("tokens.seen", 4096)
        t.metric("process.cpu.time", 12.5, group="system", unit="s")
        t.metric("loss", 2.5)
        t.metric("loss", 1.25)  # the latest value wins
        t.metric("hw.energy", 1000.0, group="system.gpu.1", unit="J", attributes={"hw.id": "1", "hw.type": "gpu"})
        t.metric("system.disk.io", 10, group="system", unit="By", attributes={"disk.io.direction": "read"})
        t.metric("system.disk.io", 30, group="system", unit="By", attributes={"disk.io.direction": "write"})
        t.metric("data.wait", 250.0, unit="ms")  # served in seconds
        t.metric("node.energy", 1.5, unit="kWh")  # joules in another scale: in joules, a counter as J is
        t.metric("nan.metric", math.nan)
        t.metric("inf.metric", -math.inf, unit="s")
        stat = Stat("step.time", ("mean", "p50", "max", "p99.9"), samples=4, unit="s", telemetry=t)
        for v in (0.1, 0.2, 0.3, 0.4):
            stat.add(v)
        t.event("training_metrics_update", {"mfu": 0.5, "final": True}, group="training")  # the store's, not a series
        assert t.flush()
        samples = scrape(sink.port or 0)
        assert only(samples, "telemetrain_loss") == 1.25
        assert only(samples, "telemetrain_tokens_seen_total") == 4096
        assert only(samples, "process_cpu_time_seconds_total") == 12.5
        (labels, value), = samples["hw_energy_joules_total"]
        assert value == 1000.0 and labels == {"rank": "0", "hw_id": "1", "hw_type": "gpu"}
        disk = {lab["disk_io_direction"]: v for lab, v in samples["system_disk_io_bytes_total"]}
        assert disk == {"read": 10, "write": 30}  # one family, a series per direction, a counter
        assert only(samples, "telemetrain_data_wait_seconds") == 0.25
        text = OPENER.open(f"http://127.0.0.1:{sink.port}/metrics", timeout=10).read().decode()
        helps = {f.name: f.documentation for f in text_string_to_metric_families(text)}
        assert helps["telemetrain_data_wait_seconds"] == "data.wait (ms, served in s)"  # HELP: not "(ms)" alone
        assert helps["process_cpu_time_seconds"] == "process.cpu.time (s)" and helps["telemetrain_loss"] == "loss"
        assert only(samples, "telemetrain_node_energy_joules_total") == 1.5 * 3.6e6
        # the identity: rank on every series, the rest once, in the info metric
        (labels, value), = samples["telemetrain_loss"]
        assert labels == {"rank": "0"}
        (info, one), = samples["telemetrain_run_info"]
        assert one == 1 and {k: info[k] for k in IDENTITY} == {k: str(v) for k, v in IDENTITY.items()}
        assert info["host"] == t.identity.host and info["world_size"] == "1"
        assert math.isnan(only(samples, "telemetrain_nan_metric"))
        assert only(samples, "telemetrain_inf_metric_seconds") == -math.inf
        # a stat without the histogram aggregation: a summary (quantiles of the last window; count and sum cumulative)
        assert only(samples, "telemetrain_step_time_seconds_count") == 4
        assert only(samples, "telemetrain_step_time_seconds_sum") == pytest.approx(1.0)
        quantiles = {lab["quantile"]: v for lab, v in samples["telemetrain_step_time_seconds"]}
        assert quantiles == {"0.5": pytest.approx(0.25), "0.999": pytest.approx(0.4, rel=1e-2)}
        assert only(samples, "telemetrain_step_time_seconds_max") == pytest.approx(0.4)
        assert "telemetrain_step_time_seconds_mean" not in samples  # rate(_sum) / rate(_count)
        assert not any("mfu" in name or "final" in name for name in samples)  # events are not series
        kinds = {lab["kind"]: v for lab, v in samples["telemetrain_records_total"]}
        assert kinds["metric"] == 11 and kinds["stat"] == 1 and kinds["event"] == 1
    finally:
        t.close()
    assert not sink.serving


def test_a_counter_whose_name_ends_in_total_gets_one_total() -> None:
    """Names that end in ``_total`` are counters (``cumulative.is_cumulative``); the suffix is not doubled, with or
    without a unit suffix between (``io.bytes_total`` in ``By``: ``telemetrain_io_bytes_total``)."""
    t = Telemetry(identity_from_env(**IDENTITY), store=False)
    sink = PrometheusSink(port=0, counters=["my_requests_total"])
    t.add_sink(sink)
    try:
        t.metric("tokens_total", 4096, unit="{token}")
        t.metric("requests.total", 7)
        t.metric("io.bytes_total", 2, unit="KiBy")
        t.metric("my_requests_total", 3)
        assert t.flush()
        text = OPENER.open(f"http://127.0.0.1:{sink.port}/metrics", timeout=10).read().decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        expected = {"telemetrain_tokens": 4096, "telemetrain_requests": 7, "telemetrain_io_bytes": 2048,
                    "telemetrain_my_requests": 3}
        for family, value in expected.items():
            assert families[family].type == "counter", family
            assert [(s.name, s.value) for s in families[family].samples] == [(family + "_total", value)]
            assert f"# TYPE {family}_total counter" in text  # (the text format names a counter by its sample)
        assert "_total_" not in text
    finally:
        t.close()


def test_a_stat_with_a_histogram_is_a_cumulative_classic_histogram() -> None:
    t = Telemetry(identity_from_env(**IDENTITY), store=False)
    sink = PrometheusSink(port=0)
    t.add_sink(sink)
    try:
        stat = Stat("step.time", ("histogram", "sum", "max"), samples=4, unit="s", telemetry=t)
        for v in (0.1, 0.1, 0.3, 5000.0):  # 5000 s is above the seconds range: +Inf only
            stat.add(v)
        for v in (0.1, 0.2, 0.3, 0.3):
            stat.add(v)
        assert t.flush()
        samples = scrape(sink.port or 0)
        buckets = {float(lab["le"]): v for lab, v in samples["telemetrain_step_time_seconds_bucket"]}
        assert buckets[math.inf] == 8 == only(samples, "telemetrain_step_time_seconds_count")
        assert only(samples, "telemetrain_step_time_seconds_sum") == pytest.approx(5001.4)
        bounds = sorted(b for b in buckets if b != math.inf)
        assert bounds[-1] == 2.0**12 and all(b2 == pytest.approx(b1 * 2**0.5) for b1, b2 in itertools.pairwise(bounds))
        assert bounds[0] < 0.1 <= bounds[1] and buckets[bounds[0]] == 0  # from the empty bucket below the lowest filled
        counts = [buckets[b] for b in bounds]
        assert counts == sorted(counts)  # cumulative
        for le, expected in ((0.125, 3), (0.25, 4), (0.36, 7), (4096.0, 7)):  # 5000 s only under +Inf
            assert max(v for b, v in buckets.items() if b <= le) == expected, le
        assert only(samples, "telemetrain_step_time_seconds_max") == 0.3  # the last window's
        assert "telemetrain_step_time_seconds" not in samples  # no quantile gauges: histogram_quantile
    finally:
        t.close()


def test_a_unit_that_is_not_ucum_is_warned_about_once() -> None:
    sink = PrometheusSink(port=0)
    identity = identity_from_env(**IDENTITY)
    try:
        with pytest.warns(Warning, match=r"unit 'bytes' of metric 'ckpt.size' is not a UCUM unit.*'By' for bytes"):
            sink.write([MetricPoint(0, 0, identity, "default", "ckpt.size", 1.0, "bytes"),
                        MetricPoint(0, 0, identity, "default", "flops", 1.0, "TFLOP/s"),
                        MetricPoint(0, 0, identity, "default", "ok", 1.0, "By")])
        assert sink.non_ucum_units == {"bytes", "TFLOP/s"}
        samples = scrape(sink.port or 0)
        assert only(samples, "telemetrain_ckpt_size") == 1.0 and only(samples, "telemetrain_ok_bytes") == 1.0
    finally:
        sink.close()


def test_a_scrape_sees_whole_batches() -> None:
    """Two metrics written in one batch always show the same value, while batches keep coming."""
    sink = PrometheusSink(port=0)
    identity = identity_from_env(**IDENTITY)
    stop = threading.Event()
    written = [0]

    def writer() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            sink.write([MetricPoint(0, 0, identity, "default", name, float(i)) for name in ("a", "b", "c")])
            written[0] = i

    thread = threading.Thread(target=writer)
    thread.start()
    seen: set[float] = set()
    try:
        deadline = time.monotonic() + 10
        while len(seen) < 20 and time.monotonic() < deadline:
            samples = scrape(sink.port or 0)
            if "telemetrain_a" not in samples:
                continue
            a, b, c = (only(samples, f"telemetrain_{n}") for n in "abc")
            assert a == b == c
            seen.add(a)
    finally:
        stop.set()
        thread.join()
        sink.close()
    assert len(seen) >= 2, f"the scrapes saw {len(seen)} distinct values over {written[0]} batches"


def test_a_taken_port_is_contained_and_served_once_free(tmp_path: Path) -> None:
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    port = blocker.getsockname()[1]
    t = Telemetry(identity_from_env(**IDENTITY), store=tmp_path)
    try:
        sink = PrometheusSink(port=port)  # no exception: the port is the environment's, not a programming error
        assert not sink.serving and sink.bind_error is not None
        t.add_sink(sink)
        with pytest.warns(Warning, match="prometheus"):
            t.metric("loss", 3.0)  # training goes on
            assert t.flush()
        (stats,) = [s for s in t.health()["sinks"] if s["sink"] == "prometheus"]
        assert stats["failures"] == 1 and stats["failed"] == 1
        assert f"127.0.0.1:{port}" in stats["last_error"]
        assert t.flush()  # the diagnostic went to the run store's queue after the store's own flush
        diagnostics = open_run(run_dir_of(t)).records("diagnostic")
        assert [d.name for d in diagnostics if d.sink == "prometheus"] == ["sink_error"]
        blocker.close()  # the port is free again: the next write binds it
        t.metric("acc", 0.9)
        assert t.flush()
        assert sink.serving and sink.port == port
        samples = scrape(port)
        assert only(samples, "telemetrain_loss") == 3.0 and only(samples, "telemetrain_acc") == 0.9
    finally:
        blocker.close()
        t.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_does_not_serve_the_parents_socket(tmp_path: Path) -> None:
    t = Telemetry(identity_from_env(**IDENTITY), store=False)
    sink = PrometheusSink(port=0)
    t.add_sink(sink)
    try:
        t.metric("loss", 1.0)
        assert t.flush()
        parent_port = sink.port
        fd = sink._server.socket.fileno()
        result = tmp_path / "child.json"
        pid = os.fork()
        if pid == 0:  # the child: report what it sees, then leave without running the parent's cleanup
            code = 1
            try:
                threads = [th.name for th in threading.enumerate() if th.name.startswith("telemetrain-prometheus")]
                try:
                    os.fstat(fd)
                    fd_open = True
                except OSError:
                    fd_open = False
                state = {"serving": sink.serving, "port": sink.port, "threads": threads, "fd_open": fd_open}
                t.metric("child", 2.0)  # port 0: the child binds a port of its own
                t.flush()
                state["child_port"] = sink.port
                state["child_scrape"] = "telemetrain_child" in scrape(sink.port or 0)
                t.close()
                result.write_text(json.dumps(state))
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        state = json.loads(result.read_text())
        assert state["serving"] is False and state["port"] is None and state["threads"] == []
        assert state["fd_open"] is False
        assert state["child_port"] not in (None, parent_port) and state["child_scrape"] is True
        samples = scrape(parent_port or 0)  # the parent still serves, and only its own values
        assert only(samples, "telemetrain_loss") == 1.0 and "telemetrain_child" not in samples
    finally:
        t.close()


# -- a real Prometheus server scraping the endpoint -------------------------------------------------------------------


@pytest.mark.skipif(PROMETHEUS is None, reason="the prometheus binary is absent (Debian: apt-get install prometheus)")
def test_a_real_prometheus_scrapes_metrics_stats_and_the_training_report(tmp_path: Path) -> None:
    t = Telemetry(identity_from_env(**IDENTITY), store=tmp_path / "runs")
    sink = PrometheusSink(port=0)
    t.add_sink(sink)
    try:
        t.metric("loss", 0.75, step=10)
        t.metric("hw.energy", 5000.0, group="system.gpu.0", unit="J", attributes={"hw.id": "0", "hw.type": "gpu"})
        t.metric("process.memory.usage", 2.0**30, group="system", unit="By")
        t.metric("nan.metric", math.nan)
        t.metric("inf.metric", math.inf)
        stat = Stat("data.wait", ("mean", "p50", "p99"), samples=3, unit="s", telemetry=t)
        for v in (0.5, 1.0, 3.0):
            stat.add(v)
        recorder = TrainingRecorder(
            TrainingTelemetryConfig(global_batch_size_or_fn=2, seq_length_or_fn=8, log_every_n_train_iterations=2,
                                    flops_per_sample_or_fn=1e12, peak_tflops_per_gpu=100.0),
            telemetry=t,
        )
        base = float(int(time.time() * 1000) - 60_000)
        recorder.on_train_start(0, start_time_msec=base)
        for it in range(4):
            recorder.on_training_single_iteration_start(base + 100 * it)
            recorder.on_training_single_iteration_end(base + 100 * it + 80)
        assert t.flush()
        reports = [
            e.attributes for e in open_run(run_dir_of(t)).records("event") if e.name == "training_metrics_update"
        ]
        report = reports[-1]

        with prometheus_server(tmp_path, sink.port or 0) as prom:
            (loss,) = wait_for(prom, "telemetrain_loss")
            labels = loss["metric"]
            assert float(loss["value"][1]) == 0.75
            assert labels == {"__name__": "telemetrain_loss", "rank": "0", "job": "telemetrain",
                              "instance": f"127.0.0.1:{sink.port}"}  # no identity labels, no step: constant series
            # the identity, joined in by the info metric
            join = "telemetrain_loss * on(instance, rank) group_left(run_id, perf_tag) telemetrain_run_info"
            (joined,) = wait_for(prom, join)
            assert (joined["metric"]["run_id"], joined["metric"]["perf_tag"]) == ("run-a", "bs32")

            (energy,) = wait_for(prom, "hw_energy_joules_total")
            assert energy["metric"]["hw_id"] == "0" and float(energy["value"][1]) == 5000.0
            (memory,) = wait_for(prom, "process_memory_usage_bytes")
            assert float(memory["value"][1]) == 2.0**30
            assert wait_for(prom, "telemetrain_nan_metric")[0]["value"][1] == "NaN"
            assert wait_for(prom, "telemetrain_inf_metric")[0]["value"][1] == "+Inf"

            assert float(wait_for(prom, "telemetrain_data_wait_seconds_count")[0]["value"][1]) == 3
            assert float(wait_for(prom, "telemetrain_data_wait_seconds_sum")[0]["value"][1]) == pytest.approx(4.5)
            (median,) = wait_for(prom, 'telemetrain_data_wait_seconds{quantile="0.5"}')
            assert float(median["value"][1]) == pytest.approx(1.0)

            # the derived training metrics: base units, counters for the totals, the iteration time a histogram
            expected = {
                "telemetrain_train_samples_per_second": report["samples_per_second"],
                "telemetrain_train_tokens_per_second": report["tokens_per_second"],
                "telemetrain_train_flops_per_gpu_per_second": report["train_throughput_per_gpu"] * 1e12,
                "telemetrain_train_mfu_ratio": report["mfu"],
                "telemetrain_train_iterations_total": report["num_iterations"],
                "telemetrain_train_samples_total": report["num_train_samples"],
                "telemetrain_train_tokens_total": report["train_tokens"],
                "telemetrain_train_flops_total": report["total_flops"],
                "telemetrain_train_iteration_time_seconds_count": 3,  # the first iteration is the warm-up
                "telemetrain_train_iteration_time_seconds_sum": 3 * 0.08,
            }
            for name, value in expected.items():
                (series,) = wait_for(prom, name)
                assert float(series["value"][1]) == pytest.approx(value, rel=1e-6), name
            (p50,) = wait_for(prom, "histogram_quantile(0.5, telemetrain_train_iteration_time_seconds_bucket)")
            assert 2**-4 < float(p50["value"][1]) <= 2**-3.5  # 0.08 s lies in the bucket (0.0625, 0.0884]
            # no duplicates: one series per value (the event's attributes are not served a second time)
            names = {r["metric"]["__name__"] for r in query(prom, '{__name__=~"telemetrain_train.*"}')}
            assert not any(n.startswith(("telemetrain_train_avg", "telemetrain_train_p99", "telemetrain_train_current"))
                           for n in names), names
            kinds = {r["metric"]["kind"] for r in wait_for(prom, "telemetrain_records_total")}
            assert {"metric", "stat", "event", "span_start", "span_end"} <= kinds
    finally:
        t.close()


@pytest.mark.skipif(PROMETHEUS is None, reason="the prometheus binary is absent (Debian: apt-get install prometheus)")
def test_the_documented_info_join_works_when_the_rank_is_set_after_start(tmp_path: Path) -> None:
    """Identities set once the process group is up (``set_identity(...)``): a process whose rank changed serves an
    info series per rank; one whose rank stayed (rank 0 learning the world size) serves only its current identity.
    The join the docs show matches each series with one info series, and does not fail as many-to-many."""
    join = "* on(instance, rank) group_left(run_id, perf_tag) telemetrain_run_info"
    doc = (Path(__file__).parents[1] / "docs" / "backends" / "prometheus.md").read_text()
    assert f"telemetrain_train_mfu_ratio {join}" in doc
    ranks = [Telemetry(identity_from_env(**{**IDENTITY, "rank": 0, "local_rank": 0}), store=False),
             Telemetry(identity_from_env(**{**IDENTITY, "rank": 0, "local_rank": 1}), store=False)]
    sinks = [PrometheusSink(port=0) for _ in ranks]
    try:
        for t, sink in zip(ranks, sinks, strict=True):
            t.add_sink(sink)
            t.metric("loss", 3.0)
        # rank 0 stays 0 and learns the world size; the other process learns its rank
        ranks[0].set_identity(world_size=2, perf_tag="bs64")
        ranks[1].set_identity(rank=1, world_size=2, perf_tag="bs64")
        for t in ranks:
            t.metric("loss", 2.0 + t.identity.rank)
            assert t.flush()
        info = scrape(sinks[0].port or 0)["telemetrain_run_info"]  # the current identity only, for rank 0
        assert [labels["world_size"] for labels, _ in info] == ["2"]
        assert len(scrape(sinks[1].port or 0)["telemetrain_run_info"]) == 2  # one per rank it had
        with prometheus_server(tmp_path, *(sink.port or 0 for sink in sinks)) as prom:
            for sink in sinks:
                wait_for(prom, f'telemetrain_run_info{{instance="127.0.0.1:{sink.port}"}}')
            joined = wait_for(prom, f"telemetrain_loss {join}")
            got = {(m["instance"] == f"127.0.0.1:{sinks[0].port}", m["rank"], m["perf_tag"], float(r["value"][1]))
                   for r in joined for m in [r["metric"]]}
            # the first process: its one series; the second: rank 0's series joined with the identity it had then
            assert got == {(True, "0", "bs64", 2.0), (False, "0", "bs32", 3.0), (False, "1", "bs64", 3.0)}
    finally:
        for t in ranks:
            t.close()


@pytest.mark.skipif(PROMETHEUS is None, reason="the prometheus binary is absent (Debian: apt-get install prometheus)")
def test_histogram_quantile_across_two_ranks_in_a_real_prometheus(tmp_path: Path) -> None:
    """Rank 0's iterations all take 0.1 s; 4% of rank 1's take 0.3 s. The p99 of the job (both ranks, same rate) lies
    in the 0.3 s bucket, which neither rank's own p99 gauge could have told: Prometheus' own histogram_quantile over
    ``sum by (le) (rate(...))`` finds it, by linear interpolation inside the bucket (0.25, 0.3536]."""
    telemetries = [Telemetry(identity_from_env(**{**IDENTITY, "rank": rank, "local_rank": rank, "world_size": 2}),
                             store=False) for rank in (0, 1)]
    sinks = [PrometheusSink(port=0) for _ in telemetries]
    stats = []
    for t, sink in zip(telemetries, sinks, strict=True):
        t.add_sink(sink)
        stats.append(Stat("step.time", ("histogram", "sum"), samples=100, unit="s", telemetry=t))
    rank_values = ([0.1] * 100, [0.1] * 96 + [0.3] * 4)
    stop = threading.Event()

    def feed() -> None:  # both ranks at the same rate: 100 iterations each per 100 ms
        while not stop.is_set():
            for stat, values in zip(stats, rank_values, strict=True):
                for v in values:
                    stat.add(v)
            for t in telemetries:
                t.flush()
            stop.wait(0.1)

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        with prometheus_server(tmp_path, *(s.port or 0 for s in sinks)) as prom:
            promql = "histogram_quantile(0.99, sum by (le) (rate(telemetrain_step_time_seconds_bucket[5s])))"
            rank0 = ('histogram_quantile(0.99, sum by (le) '
                     '(rate(telemetrain_step_time_seconds_bucket{rank="0"}[5s])))')
            deadline = time.monotonic() + WAIT_S
            while True:  # until both ranks have been scraped a few times inside the window
                ranks = query(prom, "count by (rank) (count_over_time(telemetrain_step_time_seconds_count[5s]) >= 4)")
                if len(ranks) == 2 or time.monotonic() > deadline:
                    break
                time.sleep(0.25)
            (p99,) = wait_for(prom, promql)
            (p99_rank0,) = wait_for(prom, rank0)
    finally:
        stop.set()
        feeder.join()
        for t in telemetries:
            t.close()
    low, high = 2**-2, 2**-1.5  # the bucket of 0.3 s
    share_below = 0.98  # of all iterations, those of 0.1 s
    expected = low + (high - low) * (0.99 - share_below) / (1 - share_below)
    assert float(p99["value"][1]) == pytest.approx(expected, abs=0.02)
    assert float(p99_rank0["value"][1]) < 0.13  # rank 0 alone: its 0.1 s bucket


# -- pushing to a Pushgateway (short jobs) ----------------------------------------------------------------------------

PUSHGATEWAY = shutil.which("prometheus-pushgateway") or (
    "/usr/bin/prometheus-pushgateway" if os.path.exists("/usr/bin/prometheus-pushgateway") else None
)
needs_pushgateway = pytest.mark.skipif(
    PUSHGATEWAY is None,
    reason="the prometheus-pushgateway binary is absent (Debian: apt-get install prometheus-pushgateway)",
)


@contextlib.contextmanager
def pushgateway(tmp_path: Path) -> Iterator[str]:
    """Start Debian's ``prometheus-pushgateway`` on a free loopback port; yield its base URL."""
    assert PUSHGATEWAY is not None
    port = free_port()
    with _serve([PUSHGATEWAY, f"--web.listen-address=127.0.0.1:{port}",
                 f"--persistence.file={tmp_path / 'pushgateway.data'}"], port, tmp_path / "pushgateway.log") as base:
        yield base


def gateway_samples(base: str, job: str) -> dict[str, list[Any]]:
    """{sample name: [(labels, value), ...]} of the series pushed under ``job``, from the gateway's /metrics."""
    text = OPENER.open(f"{base}/metrics", timeout=10).read().decode()
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("job") == job:
                out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def by_rank(entries: list[Any]) -> dict[str, float]:
    return {labels["rank"]: float(value) for labels, value in entries}


def test_bad_push_arguments_raise_at_once() -> None:
    with pytest.raises(TypeError, match="push_to"):
        PrometheusSink(port=0, push_to=9091)  # type: ignore[arg-type]
    for url in ("", "ftp://gw:9091", "http://", "http://gw:notaport", "http://gw:99999"):
        with pytest.raises(ValueError, match="push_to"):
            PrometheusSink(port=0, push_to=url)
    with pytest.raises(TypeError, match="push_job"):
        PrometheusSink(port=0, push_to="http://127.0.0.1:9091", push_job=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="push_job"):
        PrometheusSink(port=0, push_to="http://127.0.0.1:9091", push_job="")
    for timeout in (0, -1.0, math.inf, math.nan, True):
        with pytest.raises(ValueError, match="push_timeout"):
            PrometheusSink(port=0, push_to="http://127.0.0.1:9091", push_timeout=timeout)
    with pytest.raises(TypeError, match="serve"):
        PrometheusSink(port=0, push_to="http://127.0.0.1:9091", serve="no")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="serve=False needs push_to"):
        PrometheusSink(serve=False)
    sink = PrometheusSink(push_to="127.0.0.1:9091/", serve=False)  # no scheme: http, as prometheus_client reads it
    assert sink.push_to == "http://127.0.0.1:9091" and not sink.serving and sink.port is None
    sink.close()  # nothing written: nothing to push, nothing raised


@needs_pushgateway
def test_a_short_job_pushes_to_a_real_pushgateway_without_serving(tmp_path: Path) -> None:
    with pushgateway(tmp_path) as gateway:
        t = Telemetry(identity_from_env(**IDENTITY), store=False)
        sink = PrometheusSink(push_to=gateway, push_job="short-job", serve=False, counters=["tokens.seen"])
        assert not sink.serving and sink.port is None and sink.address is None
        t.add_sink(sink)
        try:
            t.metric("loss", 2.5)
            t.metric("tokens.seen", 4096)
            t.metric("hw.energy", 1000.0, group="system.gpu.1", unit="J", attributes={"hw.id": "1", "hw.type": "gpu"})
            stat = Stat("step.time", ("mean", "max"), samples=2, unit="s", telemetry=t)
            stat.add(0.1)
            stat.add(0.3)
            assert t.flush()
            samples = gateway_samples(gateway, "short-job")
            (labels, value), = samples["telemetrain_loss"]
            assert value == 2.5
            assert labels["job"] == "short-job" and (labels["run_id"], labels["rank"]) == ("run-a", "0")  # the group's
            (labels, _), = samples["telemetrain_run_info"]
            assert {k: labels[k] for k in IDENTITY} == {k: str(v) for k, v in IDENTITY.items()}
            assert labels["host"] == t.identity.host
            assert only(samples, "telemetrain_tokens_seen_total") == 4096
            (labels, value), = samples["hw_energy_joules_total"]
            assert value == 1000.0 and labels["hw_id"] == "1"
            assert only(samples, "telemetrain_step_time_seconds_count") == 2
            assert only(samples, "telemetrain_step_time_seconds_sum") == pytest.approx(0.4)
            # the group's own bookkeeping, under the grouping key: run_id and rank
            (labels, _), = samples["push_time_seconds"]
            assert (labels["run_id"], labels["rank"]) == ("run-a", "0")
            assert only(samples, "push_failure_time_seconds") == 0  # never failed
            t.metric("loss", 1.25)  # the next push replaces the group's values
        finally:
            t.close()  # the final flush pushes
        samples = gateway_samples(gateway, "short-job")
        assert only(samples, "telemetrain_loss") == 1.25
        kinds = {labels["kind"]: value for labels, value in samples["telemetrain_records_total"]}
        assert kinds["metric"] == 4 and kinds["stat"] == 1
        assert sink.push_error is None and sink.pushes == 2  # one per flush; close did not push the same again
        (stats,) = [s for s in t.health()["sinks"] if s["sink"] == "prometheus"]
        assert stats["failures"] == 0


@needs_pushgateway
def test_each_rank_is_its_own_group_and_the_endpoint_still_serves(tmp_path: Path) -> None:
    """The identity changes mid-run (rank set after init): each run_id/rank pushes its own group, no conflict."""
    with pushgateway(tmp_path) as gateway:
        t = Telemetry(identity_from_env(**IDENTITY), store=False)
        sink = PrometheusSink(port=0, push_to=gateway)  # serves and pushes
        t.add_sink(sink)
        try:
            t.metric("loss", 3.0)
            t.set_identity(rank=1, world_size=2)
            t.metric("loss", 2.0)
            assert t.flush()
            samples = gateway_samples(gateway, "telemetrain")
            assert by_rank(samples["telemetrain_loss"]) == {"0": 3.0, "1": 2.0}
            assert set(by_rank(samples["push_time_seconds"])) == {"0", "1"}
            assert by_rank(scrape(sink.port or 0)["telemetrain_loss"]) == {"0": 3.0, "1": 2.0}
        finally:
            t.close()
        assert sink.push_error is None and not sink.serving


@needs_pushgateway
@pytest.mark.skipif(PROMETHEUS is None, reason="the prometheus binary is absent (Debian: apt-get install prometheus)")
def test_the_documented_info_join_through_a_pushgateway(tmp_path: Path) -> None:
    """Scraped from the gateway (``honor_labels: true``, as documented), two runs' rank 0 groups: every series has
    ``instance=""``, so the join the docs give for the gateway matches on ``run_id`` and ``rank``."""
    join = "* on(run_id, rank) group_left(perf_tag) telemetrain_run_info"
    doc = (Path(__file__).parents[1] / "docs" / "backends" / "prometheus.md").read_text()
    assert "join `on(run_id, rank) group_left(perf_tag)` there" in doc
    with pushgateway(tmp_path) as gateway:
        for run_id, perf_tag, loss in (("run-a", "bs32", 3.0), ("run-b", "bs64", 2.0)):  # a run, then its restart
            t = Telemetry(identity_from_env(**{**IDENTITY, "run_id": run_id, "perf_tag": perf_tag}), store=False)
            t.add_sink(PrometheusSink(push_to=gateway, serve=False))
            t.metric("loss", loss)
            t.close()
        gateway_port = int(gateway.rsplit(":", 1)[1])
        with prometheus_server(tmp_path, gateway_port, honor_labels=True) as prom:
            wait_for(prom, "telemetrain_run_info")
            joined = wait_for(prom, f"telemetrain_loss {join}")
            got = {(m["run_id"], m["perf_tag"], m.get("instance", ""), float(r["value"][1]))
                   for r in joined for m in [r["metric"]]}
            assert got == {("run-a", "bs32", "", 3.0), ("run-b", "bs64", "", 2.0)}


def test_a_pushgateway_that_is_down_is_counted_and_training_goes_on(tmp_path: Path) -> None:
    port = free_port()  # closed: nothing listens there
    t = Telemetry(identity_from_env(**IDENTITY), store=tmp_path)
    sink = PrometheusSink(push_to=f"http://127.0.0.1:{port}", serve=False)
    t.add_sink(sink)
    try:
        with pytest.warns(Warning, match="prometheus"):
            t.metric("loss", 3.0)  # training goes on
            assert t.flush()
        (stats,) = [s for s in t.health()["sinks"] if s["sink"] == "prometheus"]
        assert stats["failures"] == 1 and stats["failed"] == 0  # the push failed; the records were taken
        assert stats["delivered"] == 1 and not stats["suspended"]
        assert f"prometheus push to http://127.0.0.1:{port}" in stats["last_error"]
        assert isinstance(sink.push_error, OSError)
        assert t.flush()  # the diagnostic went to the run store's queue after the store's own flush
        diagnostics = open_run(run_dir_of(t)).records("diagnostic")
        assert "sink_error" in [d.name for d in diagnostics if d.sink == "prometheus"]
        t.metric("acc", 0.9)  # still taken, still counted
        assert t.flush()
        (stats,) = [s for s in t.health()["sinks"] if s["sink"] == "prometheus"]
        assert stats["delivered"] == 2 and stats["failures"] >= 2
    finally:
        t.close()


@needs_pushgateway
def test_close_pushes_what_no_flush_pushed(tmp_path: Path) -> None:
    """A sink used without the dispatcher (write, then close): close pushes the values."""
    with pushgateway(tmp_path) as gateway:
        sink = PrometheusSink(push_to=gateway, push_job="direct", serve=False)
        identity = identity_from_env(**IDENTITY)
        sink.write([MetricPoint(0, 0, identity, "default", "loss", 0.5)])
        assert gateway_samples(gateway, "direct") == {}  # a write does not push
        sink.close()
        assert only(gateway_samples(gateway, "direct"), "telemetrain_loss") == 0.5
        assert sink.pushes == 1
        sink.flush()  # closed: no push, nothing raised
        assert sink.pushes == 1
