"""``TrainingTelemetryConfig``: one-logger's training config (same field names, the same lazy ``*_or_fn`` values),
validated when built, settable late (``TrainingRecorder.set_training_telemetry_config``), plus ours: warm-up, the
export sampling of iteration spans, the peak FLOP/s for MFU.

``*_or_fn`` fields take a value or a zero-argument callable evaluated when the value is needed (one-logger's
pattern: e.g. a batch size known only after the data loader is built). The property without the suffix evaluates it.

perf_tag / session_tag / is_baseline_run, as one-logger's README defines them: jobs that should perform alike (same
model, same hardware, same settings) share a ``perf_tag``, so they can be compared and regressions flagged; the
processes and restarts that together make one logical run (one training, resumed after failures) share a
``session_tag``; ``is_baseline_run`` marks the run others are compared with. ``session_tag`` comes from the run
identity (``TELEMETRAIN_SESSION_TAG``, or the launcher's run id) unless given here.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from .checkpoint import CheckPointStrategy, CheckpointStrategy
from .errors import InvalidConfigError
from .flops import normalize_dtype

__all__ = [
    "ApplicationType",
    "CheckPointStrategy",
    "CheckpointStrategy",
    "TrainingTelemetryConfig",
    "config_overrides",
    "evaluate",
    "lax_bool",
    "lax_int",
]


class ApplicationType(str, enum.Enum):
    """What kind of job the telemetry describes (one-logger's ``ApplicationType``)."""

    TRAINING = "training"
    VALIDATION = "validation"
    BATCH_INFERENCE = "batch_inference"
    ONLINE_INFERENCE = "online_inference"
    DATA_PROCESSING = "data_processing"

    def __str__(self) -> str:
        return self.value


def evaluate(value_or_fn: Any) -> Any:
    """A ``*_or_fn`` value: call it if it is callable."""
    return value_or_fn() if callable(value_or_fn) else value_or_fn


_TRUE_TEXT = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE_TEXT = frozenset({"0", "off", "f", "false", "n", "no"})


# one-logger's configs are pydantic models, which convert in "lax" mode: ``world_size_or_fn=os.environ["WORLD_SIZE"]``
# is 4 there, and ``is_log_throughput_enabled_or_fn="false"`` is False (a non-empty str would be truthy here)
def lax_int(value: Any) -> Any:
    """pydantic's lax int: an integral float or a str holding an integer becomes an int; anything else unchanged
    (the field's own check names what is wrong)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+(\.0*)?\s*", value):
        return int(value.strip().split(".")[0])
    return value


def lax_bool(value: Any, name: str) -> Any:
    """pydantic's lax bool: "true"/"false", "yes"/"no", "on"/"off", "1"/"0" (any case) and the numbers 0 and 1
    become bools; another str is an error naming the field."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE_TEXT or text in _FALSE_TEXT:
            return text in _TRUE_TEXT
        raise InvalidConfigError(f"{name} must be a bool (or a function returning one), got {value!r}")
    if not isinstance(value, bool) and isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    return value


def _positive_int(value: Any, name: str, *, allow_none: bool = True) -> None:
    if (value is None and allow_none) or callable(value):
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidConfigError(f"{name} must be a positive int (or a function returning one), got {value!r}")


@dataclasses.dataclass
class TrainingTelemetryConfig:
    """The job's training facts. ``global_batch_size_or_fn`` (samples per iteration, across ranks) and
    ``perf_tag_or_fn`` are required, as in one-logger."""

    global_batch_size_or_fn: int | Callable[[], int]
    perf_tag_or_fn: str | list[str] | Callable[[], str | list[str]] = ""
    micro_batch_size_or_fn: int | Callable[[], int] | None = None
    seq_length_or_fn: int | Callable[[], int] | None = None
    flops_per_sample_or_fn: float | Callable[[], float] | None = None
    train_iterations_target_or_fn: int | Callable[[], int] | None = None
    train_samples_target_or_fn: int | Callable[[], int] | None = None
    log_every_n_train_iterations: int = 50
    is_log_throughput_enabled_or_fn: bool | Callable[[], bool] = False
    is_train_iterations_enabled_or_fn: bool | Callable[[], bool] = True
    is_validation_iterations_enabled_or_fn: bool | Callable[[], bool] = True
    is_test_iterations_enabled_or_fn: bool | Callable[[], bool] = True
    is_save_checkpoint_enabled_or_fn: bool | Callable[[], bool] = True
    save_checkpoint_strategy: CheckPointStrategy | str = CheckPointStrategy.SYNC
    custom_metadata: Mapping[str, Any] | None = None
    session_tag_or_fn: str | Callable[[], str] | None = None
    is_baseline_run_or_fn: bool | Callable[[], bool] = False
    world_size_or_fn: int | Callable[[], int] | None = None
    app_type_or_fn: ApplicationType | str | Callable[[], ApplicationType | str] = ApplicationType.TRAINING
    # ours
    warmup_iterations: int = 1
    export_iteration_spans_every: int | None = None
    peak_tflops_per_gpu: float | None = None
    device_name: str | None = None
    dtype: str = "bfloat16"
    # device time (training.device_timing): "auto" (CUDA events when the model runs on CUDA), "cuda", "host", or a
    # DeviceClock; GPU energy per sample/token (system.energy): True reads this process's GPUs through NVML when the
    # job uses CUDA, False never, or an object with read() -> EnergyReading | None
    device_timing: Any = "auto"
    # device-time one iteration in this many (1: every one). An iteration's marks cost the training thread ~30-45 us
    # of driver calls on an H100 host (BENCHMARKS.md "GPU truth"); sampling divides that cost, the windows' averages
    # stay per timed iteration. "auto": 8, or the report interval when it is shorter (every window has a timed one)
    device_timing_every: int | str = "auto"
    gpu_energy: Any = True

    def __post_init__(self) -> None:
        for name in _INT_FIELDS:
            setattr(self, name, lax_int(getattr(self, name)))
        for name in _BOOL_FIELDS:
            setattr(self, name, lax_bool(getattr(self, name), name))
        if isinstance(self.flops_per_sample_or_fn, str):  # an int in one-logger: "1e12" is refused there too
            self.flops_per_sample_or_fn = lax_int(self.flops_per_sample_or_fn)
        _positive_int(self.global_batch_size_or_fn, "global_batch_size_or_fn", allow_none=False)
        for name in ("micro_batch_size_or_fn", "seq_length_or_fn", "train_iterations_target_or_fn",
                     "train_samples_target_or_fn", "world_size_or_fn"):
            _positive_int(getattr(self, name), name)
        fps = self.flops_per_sample_or_fn
        if fps is not None and not callable(fps):
            if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not fps > 0 or math.isinf(fps):
                raise InvalidConfigError(f"flops_per_sample_or_fn must be > 0, got {fps!r}")
        if fps is None and self.is_log_throughput_enabled_or_fn is True:  # one-logger's rule (no figures without it)
            raise InvalidConfigError("flops_per_sample_or_fn must be set to a positive value when "
                                     "is_log_throughput_enabled_or_fn is True")
        perf = self.perf_tag_or_fn
        if not callable(perf) and not isinstance(perf, (str, list)):
            raise TypeError(f"perf_tag_or_fn must be a str, a list of str or a function, got {type(perf).__name__}")
        if isinstance(perf, list) and not all(isinstance(p, str) for p in perf):
            raise TypeError("perf_tag_or_fn must be a list of str")
        if type(self.log_every_n_train_iterations) is not int or self.log_every_n_train_iterations < 1:
            raise InvalidConfigError(
                f"log_every_n_train_iterations must be an int >= 1, got {self.log_every_n_train_iterations!r}"
            )
        try:
            self.save_checkpoint_strategy = CheckPointStrategy(self.save_checkpoint_strategy)
        except ValueError:
            raise InvalidConfigError(
                f"save_checkpoint_strategy must be 'sync' or 'async', got {self.save_checkpoint_strategy!r}"
            ) from None
        if type(self.warmup_iterations) is not int or self.warmup_iterations < 0:
            raise InvalidConfigError(f"warmup_iterations must be an int >= 0, got {self.warmup_iterations!r}")
        every = self.export_iteration_spans_every
        if every is not None and (type(every) is not int or every < 1):
            raise InvalidConfigError(f"export_iteration_spans_every must be an int >= 1, got {every!r}")
        peak = self.peak_tflops_per_gpu
        if peak is not None and (isinstance(peak, bool) or not isinstance(peak, (int, float)) or not peak > 0
                                 or math.isinf(peak)):
            raise InvalidConfigError(f"peak_tflops_per_gpu must be > 0, got {peak!r}")
        try:  # the peak (MFU) is looked up for it at the loop's start: a typo is the caller's, shown now
            normalize_dtype(self.dtype)
        except ValueError as exc:
            raise InvalidConfigError(f"dtype: {exc}") from None
        timing = self.device_timing
        if isinstance(timing, str):
            if timing not in ("auto", "cuda", "host"):
                raise InvalidConfigError(
                    f"device_timing must be 'auto', 'cuda', 'host' or a DeviceClock, got {timing!r}")
        elif not all(callable(getattr(timing, m, None)) for m in ("event", "record", "done", "elapsed_s", "begin")):
            raise TypeError("device_timing must be 'auto', 'cuda', 'host' or a DeviceClock (event, record, done, "
                            f"elapsed_s, begin), got {type(timing).__name__}")
        sample = self.device_timing_every
        if sample != "auto" and (type(sample) is not int or sample < 1):
            raise InvalidConfigError(f"device_timing_every must be 'auto' or an int >= 1, got {sample!r}")
        energy = self.gpu_energy
        if not isinstance(energy, bool) and not callable(getattr(energy, "read", None)):
            raise TypeError(f"gpu_energy must be a bool or an object with read(), got {type(energy).__name__}")
        if self.custom_metadata is not None and not isinstance(self.custom_metadata, Mapping):
            raise TypeError(f"custom_metadata must be a mapping, got {type(self.custom_metadata).__name__}")

    # -- evaluated values ------------------------------------------------------------------------------------------

    @property
    def global_batch_size(self) -> int:
        return int(evaluate(self.global_batch_size_or_fn))

    @property
    def perf_tag(self) -> str | list[str]:
        value: str | list[str] = evaluate(self.perf_tag_or_fn)
        return value

    @property
    def micro_batch_size(self) -> int | None:
        return _opt_int(evaluate(self.micro_batch_size_or_fn))

    @property
    def seq_length(self) -> int | None:
        return _opt_int(evaluate(self.seq_length_or_fn))

    @property
    def flops_per_sample(self) -> float | None:
        value = evaluate(self.flops_per_sample_or_fn)
        return None if value is None else float(value)

    @property
    def train_iterations_target(self) -> int | None:
        return _opt_int(evaluate(self.train_iterations_target_or_fn))

    @property
    def train_samples_target(self) -> int | None:
        return _opt_int(evaluate(self.train_samples_target_or_fn))

    @property
    def is_log_throughput_enabled(self) -> bool:
        return bool(evaluate(self.is_log_throughput_enabled_or_fn))

    @property
    def is_train_iterations_enabled(self) -> bool:
        return bool(evaluate(self.is_train_iterations_enabled_or_fn))

    @property
    def is_validation_iterations_enabled(self) -> bool:
        return bool(evaluate(self.is_validation_iterations_enabled_or_fn))

    @property
    def is_test_iterations_enabled(self) -> bool:
        return bool(evaluate(self.is_test_iterations_enabled_or_fn))

    @property
    def is_save_checkpoint_enabled(self) -> bool:
        return bool(evaluate(self.is_save_checkpoint_enabled_or_fn))

    @property
    def session_tag(self) -> str | None:
        value = evaluate(self.session_tag_or_fn)
        return None if value is None else str(value)

    @property
    def is_baseline_run(self) -> bool:
        return bool(evaluate(self.is_baseline_run_or_fn))

    @property
    def world_size(self) -> int | None:
        return _opt_int(evaluate(self.world_size_or_fn))

    @property
    def app_type(self) -> ApplicationType | str:
        value: ApplicationType | str = evaluate(self.app_type_or_fn)
        return value

    # -- pydantic-style helpers (one-logger's config is a pydantic model; code written for it calls these) ---------

    def model_dump(self) -> dict[str, Any]:
        """The fields as a dict (values and functions as given)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> TrainingTelemetryConfig:
        """A copy (validated again), with ``update``'s fields replaced."""
        fields = copy.deepcopy(self.model_dump()) if deep else self.model_dump()
        return TrainingTelemetryConfig(**{**fields, **(update or {})})

    def as_attributes(self) -> dict[str, Any]:
        """one-logger's ``TrainingTelemetryAttributes`` (the ``update_training_telemetry_config`` event), evaluated."""
        out: dict[str, Any] = {
            "perf_tag": self.perf_tag,
            "global_batch_size": self.global_batch_size,
            "log_every_n_train_iterations": self.log_every_n_train_iterations,
            "micro_batch_size": self.micro_batch_size,
            "seq_length": self.seq_length,
            "flops_per_sample": self.flops_per_sample,
            "train_iterations_target": self.train_iterations_target,
            "train_samples_target": self.train_samples_target,
            "checkpoint_strategy": CheckPointStrategy(self.save_checkpoint_strategy).value,
            "is_train_iterations_enabled": self.is_train_iterations_enabled,
            "is_validation_iterations_enabled": self.is_validation_iterations_enabled,
            "is_test_iterations_enabled": self.is_test_iterations_enabled,
            "is_save_checkpoint_enabled": self.is_save_checkpoint_enabled,
            "is_log_throughput_enabled": self.is_log_throughput_enabled,
            "warmup_iterations": self.warmup_iterations,
            "app_type": str(self.app_type),
        }
        if self.custom_metadata:
            out["custom_metadata"] = [f"{k}:{v}" for k, v in self.custom_metadata.items()]
        return {k: v for k, v in out.items() if v is not None}


_INT_FIELDS = ("global_batch_size_or_fn", "micro_batch_size_or_fn", "seq_length_or_fn", "train_iterations_target_or_fn",
               "train_samples_target_or_fn", "world_size_or_fn", "log_every_n_train_iterations")
_BOOL_FIELDS = ("is_log_throughput_enabled_or_fn", "is_train_iterations_enabled_or_fn",
                "is_validation_iterations_enabled_or_fn", "is_test_iterations_enabled_or_fn",
                "is_save_checkpoint_enabled_or_fn", "is_baseline_run_or_fn")


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def config_overrides(config: TrainingTelemetryConfig | None, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The field overrides an integration takes as keyword arguments, by their field name (``seq_length`` or
    ``seq_length_or_fn``), checked now rather than at the first fit: a ``config`` given whole, or ``overrides`` on
    top of a derived one, not both."""
    if config is not None and not isinstance(config, TrainingTelemetryConfig):
        raise TypeError(f"config must be a TrainingTelemetryConfig, got {type(config).__name__}")
    if config is not None and overrides:
        raise ValueError("give either config or field overrides, not both")
    fields = {f.name for f in dataclasses.fields(TrainingTelemetryConfig)}
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        name = key if key in fields else f"{key}_or_fn"
        if name not in fields:
            raise TypeError(f"unknown TrainingTelemetryConfig field {key!r} (fields: {', '.join(sorted(fields))})")
        out[name] = value
    if out:
        TrainingTelemetryConfig(**{"global_batch_size_or_fn": 1, **out})
    return out

