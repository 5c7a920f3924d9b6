"""Hyperparameters: the values a run was configured with, as the backends want them (MLflow params, TensorBoard's
HParams, OpenTelemetry attributes, the report's config table).

Three sources, one shape (a flat mapping of dotted keys to str, int, float or bool):
- the run's config, ``Telemetry(config=...)``: in ``run.json``, and handed to every sink at ``add_sink``
  (``Sink.run_config``);
- the training config (``TrainingTelemetryConfig``): the ``update_training_telemetry_config`` event;
- anything logged later (Lightning's ``save_hyperparameters()``, the Hugging Face Trainer's arguments, your own):
  ``log_hyperparams(params)``, an event ``hyperparameters`` in group ``run`` whose attributes are the flattened values.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["EVENT", "GROUP", "flatten", "is_hyperparameters", "log_hyperparams"]

GROUP = "run"
EVENT = "hyperparameters"
MAX_VALUE_CHARS = 6000  # MLflow's limit on a param value; longer text is cut


def _as_mapping(value: Any) -> Mapping[str, Any] | None:
    if isinstance(value, Mapping):
        return value
    if any(c.__name__ == "Namespace" and c.__module__ == "argparse" for c in type(value).__mro__[:-1]):
        # (argparse not imported) and its subclasses: typed namespaces, jsonargparse's (LightningCLI), as Lightning's
        # loggers take any argparse.Namespace
        return dict(vars(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return None


def _scalar(value: Any) -> str | int | float | bool:
    if type(value) in (str, int, float, bool):
        return value  # type: ignore[no-any-return]
    if isinstance(value, enum.Enum):
        return _scalar(value.value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    item = getattr(value, "item", None)  # a numpy scalar (a tensor is not called: .item() would sync the device)
    if callable(item) and getattr(value, "shape", None) == () and not hasattr(value, "dim"):
        try:
            return _scalar(item())
        except (TypeError, ValueError):
            pass
    text = str(value)
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 3] + "..."


def flatten(params: Any, prefix: str = "", sep: str = ".") -> dict[str, str | int | float | bool]:
    """Nested mappings (dicts, ``argparse.Namespace``, dataclass instances) to one level of dotted keys; values to
    str, int, float or bool (``None``, lists and other objects as their text, as MLflow logs them)."""
    mapping = _as_mapping(params)
    if mapping is None:
        raise TypeError(f"hyperparameters must be a mapping (or a Namespace, a dataclass), got {type(params).__name__}")
    out: dict[str, str | int | float | bool] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        inner = _as_mapping(value)
        if inner is not None and inner:
            out.update(flatten(inner, name + sep, sep))
        else:
            out[name] = _scalar(value) if inner is None else "{}"
    return out


def finite_or_text(value: str | int | float | bool) -> str | int | float | bool:
    """A non-finite float as its text (TensorBoard's HParams and some MLflow stores take no NaN)."""
    return str(value) if type(value) is float and not math.isfinite(value) else value


def log_hyperparams(params: Any, telemetry: Any = None) -> dict[str, str | int | float | bool]:
    """Record hyperparameters (flattened, see ``flatten``) on ``telemetry`` (default: the default instance), as the
    ``hyperparameters`` event of group ``run``; returns what was recorded."""
    flat = flatten(params)
    if telemetry is None:
        from .telemetry import get_telemetry

        telemetry = get_telemetry()
    if flat:
        telemetry.event(EVENT, flat, group=GROUP)
    return flat


def is_hyperparameters(record: Any) -> bool:
    return bool(record.kind == "event" and record.name == EVENT and record.group == GROUP)
