"""A run's perf tag and workload, from its training config.

One perf tag per run: ``TrainingTelemetryConfig(perf_tag_or_fn=...)`` when it gives one, else
``$TELEMETRAIN_PERF_TAG``, else the entry script's name (``identity_from_env``). The config's tag becomes the
``Telemetry``'s identity, so the records, their process headers, ``run.json`` and ``compare`` all carry the one the
config event shows. A list of tags (one-logger allows it) is joined with ``+``.

The workload (``run.json``'s ``workload`` and ``fingerprint``): the facts that make two runs' speeds comparable --
world size, global and micro batch size, sequence length, FLOPs per sample (the model). ``compare`` refuses runs
whose workloads clearly differ (``differences``) unless forced.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeGuard

from ..identity import _safe_name
from ..telemetry import Telemetry
from .config import TrainingTelemetryConfig

__all__ = ["WORKLOAD_KEYS", "apply_perf_tag", "config_perf_tag", "differences", "fingerprint", "publish_workload",
           "workload_from_attributes", "workload_of"]

# what makes runs comparable, in the order a difference is reported
WORKLOAD_KEYS = ("flops_per_sample", "world_size", "global_batch_size", "micro_batch_size", "seq_length")


def config_perf_tag(config: TrainingTelemetryConfig) -> str | None:
    """The config's perf tag as a run-store name (``None`` when the config gives none); evaluates a lazy one."""
    value = config.perf_tag
    if isinstance(value, list):
        value = "+".join(str(v) for v in value if v)
    if not value:
        return None
    text = str(value)
    # kept as given where the run store can hold it (an Identity's rule), else made a safe name
    return text if "/" not in text and text not in (".", "..") else _safe_name(text)


def apply_perf_tag(telemetry: Telemetry, config: TrainingTelemetryConfig) -> None:
    """Make the config's perf tag the run's: later records (and their process header) carry it, ``run.json`` is
    created with it or updated to it. It wins over ``$TELEMETRAIN_PERF_TAG``, which ``telemetrain launch`` sets to
    the entry script's name for the ranks that give none."""
    tag = config_perf_tag(config)
    if tag is not None and tag != telemetry.identity.perf_tag:
        telemetry.set_identity(perf_tag=tag)


def _guarded(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except Exception:  # noqa: BLE001 - a lazy value not ready yet: that fact is left out
        return None


def workload_of(config: TrainingTelemetryConfig, world_size: int) -> dict[str, int | float]:
    """The workload facts the config gives now (a lazy value that cannot be read yet is left out)."""
    values: dict[str, Any] = {
        "flops_per_sample": _guarded(lambda: config.flops_per_sample),
        "world_size": _guarded(lambda: config.world_size) or world_size,
        "global_batch_size": _guarded(lambda: config.global_batch_size),
        "micro_batch_size": _guarded(lambda: config.micro_batch_size),
        "seq_length": _guarded(lambda: config.seq_length),
    }
    return {k: v for k, v in values.items() if _usable(v)}


def workload_from_attributes(attributes: Mapping[str, Any], world_size: int) -> dict[str, int | float]:
    """The workload from an ``update_training_telemetry_config`` event (runs written before ``run.json`` had it)."""
    values = {key: attributes.get(key) for key in WORKLOAD_KEYS}
    values["world_size"] = world_size
    return {k: v for k, v in values.items() if _usable(v)}


def _usable(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def fingerprint(workload: Mapping[str, Any]) -> str:
    """A short stable hash of the workload: equal workloads, equal fingerprints."""
    text = json.dumps({k: workload[k] for k in sorted(workload)}, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def publish_workload(telemetry: Telemetry, config: TrainingTelemetryConfig) -> None:
    """Record the workload in ``run.json`` (``workload`` and ``fingerprint``), if the instance writes a run store."""
    store = telemetry.store
    if store is None:
        return
    work = workload_of(config, telemetry.identity.world_size)
    store.set_run_meta(workload=work, fingerprint=fingerprint(work))


def differences(candidate: Mapping[str, Any], baseline: Mapping[str, Any]) -> list[str]:
    """How two workloads clearly differ (facts both runs recorded, not equal), e.g. ``global_batch_size 64 vs 32``.
    A fact one run did not record is no difference."""
    out = []
    for key in WORKLOAD_KEYS:
        a, b = candidate.get(key), baseline.get(key)
        if _usable(a) and _usable(b) and not math.isclose(float(a), float(b), rel_tol=1e-9):
            out.append(f"{key} {_fmt(a)} vs {_fmt(b)}")
    return out


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) and not float(value).is_integer() else f"{value:g}"
