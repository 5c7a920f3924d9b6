"""What is run: the peers' files at their pinned revisions, the module mappings and the documented failures, as data."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# pytorch/pytorch revisions whose test files run with torch 2.13's ``torch.testing._internal`` (the newest
# test_monitor.py needs ``HardwareClassification``, which torch 2.13 lacks). ``--pytorch-rev`` overrides all three.
_TORCH_API_TEST_REV = "14159896cdbe0901b88a74e0344490cf7788c645"
_TORCH_LIB_TEST_REV = "0821eee16b1f4b75edbcf72ca54701c6ccc93cca"
_TORCH_MONITOR_TEST_REV = "1492ff433a85c1cfbe9229821cef433ab64ba62e"
# NVIDIA/nv-one-logger: "Release: 2.3.1" (the version compat.md describes).
ONE_LOGGER_REV = "ff0195bfdd0f8c88f96563f549968cc8d6c99023"
_OL_TESTS = "nv_one_logger/one_logger_training_telemetry/tests/nv_one_logger/training_telemetry/api"
OL_EXAMPLE = "nv_one_logger/one_logger_training_telemetry/src/nv_one_logger/training_telemetry/docs/example.py"


@dataclass(frozen=True)
class PeerFile:
    """One file of a peer: where it is in the peer's repository, at which revision, where it goes in the scratch."""

    path: str
    rev: str
    dest: str  # relative to the peer's scratch directory
    is_test: bool = True


@dataclass(frozen=True)
class Peer:
    name: str
    files: tuple[PeerFile, ...]
    # module path prefix -> telemetrain module (docs/compat.md's tables); longest match wins
    mapping: Mapping[str, str]
    # a module path of the peer's own package: any import left with it after rewriting is an error
    peer_package: str
    # one pytest process per group of files (by scratch sub-directory)
    separate_processes: bool
    expected_failures: Mapping[str, str] = field(default_factory=dict)


_TORCH_MAPPING = {
    "torch.distributed.elastic.metrics": "telemetrain.metrics",
    "torch.distributed.elastic.events": "telemetrain.events",
    "torch.monitor": "telemetrain.monitor",
}

_OL_API = "nv_one_logger.training_telemetry.api"
ONE_LOGGER_MAPPING: dict[str, str] = {
    **{
        f"{_OL_API}.{name}": f"telemetrain.training.{name}"
        for name in (
            "callbacks", "context", "config", "attributes", "spans", "events", "checkpoint",
            "training_telemetry_provider", "training_recorder",
        )
    },
    _OL_API: "telemetrain.training",
    "nv_one_logger.api.config": "telemetrain.training.one_logger_config",
    "nv_one_logger.api.telemetry_config": "telemetrain.training.one_logger_config",
    "nv_one_logger.api.one_logger_provider": "telemetrain.training.one_logger_provider",
    "nv_one_logger.api.timed_span": "telemetrain.training.timed_span",
    "nv_one_logger.api.recorder": "telemetrain.training.default_recorder",
    "nv_one_logger.core.attributes": "telemetrain.training.attributes",
    "nv_one_logger.core.event": "telemetrain.training.events",
    "nv_one_logger.core.span": "telemetrain.training.spans",
    "nv_one_logger.core.time": "telemetrain.training.timestamps",
    "nv_one_logger.core.exceptions": "telemetrain.training.errors",
    "nv_one_logger.recorder.default_recorder": "telemetrain.training.default_recorder",
    **{
        f"nv_one_logger.exporter.{name}": "telemetrain.training.exporters"
        for name in (
            "exporter", "file_exporter", "logger_exporter", "base_json_exporter", "export_config_manager",
            "exporter_config",
        )
    },
    "nv_one_logger.otel.exporter.otel_exporter": "telemetrain.training.exporters",
    "nv_one_logger.core.internal.multi_window_timer": "telemetrain.training.timers",
    "nv_one_logger.core.internal.metric_summarizer": "telemetrain.training.timers",
    "nv_one_logger.core.internal.singleton": "telemetrain.training.singleton",
    "nv_one_logger.training_telemetry.integration.pytorch_lightning": "telemetrain.integrations.lightning_trainer",
}

# Test ids relative to the peer file's name; each reason is ours and points at the docs/compat.md row.
TORCH_EXPECTED = {
    "api_test.py::MetricsApiTest::test_profile":
        "patches metrics.api.getStream per call; our @prof routes at decoration (compat.md metrics: @prof key)",
    "api_test.py::MetricsApiTest::test_inheritance":
        "same as test_profile: getStream patched, @prof routes at decoration (compat.md metrics: @prof key)",
    "lib_test.py::RdzvEventLibTest::test_construct_and_record_rdzv_event_does_not_run_if_invalid_dest":
        "rendezvous events are recorded even for a NullHandler destination (compat.md events: rendezvous events)",
    "test_monitor.py::TestMonitorTensorboard::test_event_handler":
        "after max_samples the next window starts at once: [10, 35], not [10] (compat.md torch.monitor: max_samples)",
}

_RAISE_NOT = "misuse is recorded, not raised (compat.md nv-one-logger: misuse raises OneLoggerError)"
_ONCE_ONLY = "once-only rules are recorded, warned once, ignored (compat.md nv-one-logger: misuse, builder twice)"
_CONFIG_EARLY = "a training config set before on_app_start is sent at on_app_start (compat.md: set_training_...)"
_PROVIDER_TESTS = "test_training_telemetry_provider.py::TestTrainingTelemetryProvider::"
_PROVIDER_SET = "test_training_telemetry_provider.py::TestTrainingTelemetryProviderSetTrainingTelemetryConfig::"
_E2E = "test_app_e2e_scenarios.py::TestCrashScenariosWithRealExporter::"
_RECORDER = "test_training_recorder.py::TestTrainingRecorderUpdateApplicationSpanWithTrainingTelemetryConfig::"
ONE_LOGGER_EXPECTED = {
    "test_callbacks.py::test_invalid_callback_usage": _RAISE_NOT,
    "test_training_recorder.py::test_span_with_same_name_active": _RAISE_NOT,
    _E2E + "test_timer_data_export_with_missing_first_iteration_end_and_complete_second_iteration": _RAISE_NOT,
    _E2E + "test_timer_data_export_with_new_iteration_start_before_old_iteration_end": _RAISE_NOT,
    _PROVIDER_TESTS + "test_with_base_config_called_twice_raises_error": _ONCE_ONLY,
    _PROVIDER_TESTS + "test_with_export_customization_called_twice_raises_error": _ONCE_ONLY,
    _PROVIDER_TESTS + "test_with_config_override_after_configure_provider_raises_error": _ONCE_ONLY,
    _PROVIDER_TESTS + "test_with_exporter_after_configure_provider_raises_error": _ONCE_ONLY,
    _PROVIDER_TESTS + "test_with_export_customization_after_configure_raises_error": _ONCE_ONLY,
    _PROVIDER_TESTS + "test_set_training_telemetry_config_already_set_raises_error_updated": _ONCE_ONLY,
    _PROVIDER_SET + "test_set_training_telemetry_config_already_set": _ONCE_ONLY,
    _PROVIDER_SET + "test_with_export_config_after_configure_provider_raises_error": _ONCE_ONLY,
    _PROVIDER_TESTS + "test_set_training_loop_config_deprecated": _CONFIG_EARLY,
    _RECORDER + "test_update_application_span_with_training_telemetry_config_no_app_span": _CONFIG_EARLY,
    _PROVIDER_SET + "test_set_training_telemetry_config_not_configured":
        "flips the private name-mangled __fully_configured flag (compat.md: nv-one-logger's own tests)",
    _RECORDER + "test_update_application_span_with_no_telemetry_config":
        "private method called with None: recorded, not raised (compat.md nv-one-logger: misuse)",
    _RECORDER + "test_update_application_span_skipped_when_disabled":
        "expects the per-call 'Skipping execution' log on a disabled rank (compat.md: enable_for_current_rank)",
}

_OL_TEST_FILES = (
    "test_callbacks.py", "test_context.py", "test_training_recorder.py", "test_training_telemetry_provider.py",
    "integration_test.py", "test_app_e2e_scenarios.py",
)
# the scratch package that holds one-logger's tests (they import each other relatively)
_OL_PACKAGE = "one_logger_tests"


def peers(pytorch_rev: str | None, one_logger_rev: str | None) -> tuple[Peer, Peer]:
    def t(path: str, rev: str, dest: str) -> PeerFile:
        return PeerFile(path, pytorch_rev or rev, dest)

    torch_peer = Peer(
        name="pytorch",
        files=(
            t("test/distributed/elastic/metrics/api_test.py", _TORCH_API_TEST_REV, "api_test/api_test.py"),
            t("test/distributed/elastic/events/lib_test.py", _TORCH_LIB_TEST_REV, "lib_test/lib_test.py"),
            t("test/test_monitor.py", _TORCH_MONITOR_TEST_REV, "test_monitor/test_monitor.py"),
        ),
        mapping=_TORCH_MAPPING,
        peer_package="torch.distributed.elastic",
        separate_processes=True,
        expected_failures=TORCH_EXPECTED,
    )
    ol_rev = one_logger_rev or ONE_LOGGER_REV
    support = ("__init__.py", "conftest.py", "utils.py")
    one_logger = Peer(
        name="nv-one-logger",
        files=tuple(
            PeerFile(f"{_OL_TESTS}/{name}", ol_rev, f"{_OL_PACKAGE}/{name}", is_test=name in _OL_TEST_FILES)
            for name in support + _OL_TEST_FILES
        ),
        mapping=ONE_LOGGER_MAPPING,
        peer_package="nv_one_logger",
        separate_processes=False,
        expected_failures=ONE_LOGGER_EXPECTED,
    )
    return torch_peer, one_logger



def documented_failures(peer: str) -> Mapping[str, str]:
    return TORCH_EXPECTED if peer == "pytorch" else ONE_LOGGER_EXPECTED

