"""What a system ``Sampler`` samples (a base class of it): its arguments, checked at the call (``TypeError`` /
``ValueError``: the interval, the GPUs asked for, the disk paths, the flags), and the sources they make -- the process
tree, the host and its container's memory against a cgroup limit (only on local rank 0 by default), NVIDIA GPUs and
the torch.cuda allocator -- with the filesystems whose usage it records (``/`` and the run store's by default)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..telemetry import Telemetry
from .base import Source
from .cgroup_memory import CgroupMemorySource, find_cgroup_memory
from .cuda_allocator import CudaAllocatorSource
from .host import HostSource
from .nvml import NvmlSource
from .process import ProcessTreeSource

__all__ = ["MIN_INTERVAL_S", "GpuRequest", "SamplerSources"]

MIN_INTERVAL_S = 0.01

GpuRequest = str | Sequence[int | str] | None


# -- argument checks ---------------------------------------------------------------------------------------------------


def _check_interval(interval: Any) -> float:
    if isinstance(interval, bool) or not isinstance(interval, (int, float)):
        raise TypeError(f"interval must be a number of seconds, got {type(interval).__name__}")
    if not math.isfinite(interval) or interval < MIN_INTERVAL_S:
        raise ValueError(f"interval must be a finite number of seconds >= {MIN_INTERVAL_S}, got {interval!r}")
    return float(interval)


def _check_gpus(gpus: Any) -> GpuRequest:
    if gpus is None or gpus == "all":
        return gpus  # type: ignore[no-any-return]
    if isinstance(gpus, (str, bytes)) or not isinstance(gpus, Sequence):
        raise TypeError(
            "gpus must be None (this rank's GPUs), 'all', or a list of CUDA device ordinals (int) and GPU UUIDs "
            f"(str), got {gpus!r:.80}"
        )
    out: list[int | str] = []
    for item in gpus:
        if isinstance(item, bool) or not isinstance(item, (int, str)):
            raise TypeError(f"gpus entries must be CUDA device ordinals (int) or UUIDs (str), got {item!r:.80}")
        if isinstance(item, int) and item < 0:
            raise ValueError(f"gpus entries must be >= 0, got {item}")
        if isinstance(item, str) and not item.strip():
            raise ValueError("gpus entries must be non-empty UUIDs")
        out.append(item)
    return tuple(out)


def _check_paths(paths: Any) -> tuple[str, ...] | None:
    if paths is None:
        return None
    if isinstance(paths, (str, bytes, os.PathLike)) or not isinstance(paths, Sequence):
        raise TypeError(f"disk_paths must be a list of paths, got {type(paths).__name__}")
    out = []
    for p in paths:
        if not isinstance(p, (str, os.PathLike)):
            raise TypeError(f"disk_paths entries must be paths, got {type(p).__name__}")
        out.append(os.fspath(p))
    return tuple(out)


def _check_bool(value: Any, arg: str, allow_none: bool = False) -> bool | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, bool):
        raise TypeError(f"{arg} must be {'None or ' if allow_none else ''}a bool, got {type(value).__name__}")
    return value


def _existing(path: Path) -> str:
    """``path``, or its nearest existing ancestor (a run store not written yet)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return str(candidate)
    return str(path.anchor or "/")


class SamplerSources:
    """The checked arguments of a ``Sampler`` (which sets these fields in ``__init__``) and the sources they make."""

    interval: float
    _host: bool | None
    _process_tree: bool
    _gpus: GpuRequest
    _disk_paths: tuple[str, ...] | None
    _cuda_allocator: bool
    _telemetry: Telemetry
    _nvml: NvmlSource | None

    @property
    def telemetry(self) -> Telemetry:
        return self._telemetry

    def config(self) -> tuple[Any, ...]:
        """What ``start_sampler`` compares to decide whether a running sampler already does what is asked."""
        return (self.interval, self._host, self._process_tree, self._gpus, self._disk_paths, self._cuda_allocator)

    def _records_host(self) -> bool:
        return self._host if self._host is not None else self._telemetry.identity.local_rank == 0

    def _paths(self) -> list[str]:
        if self._disk_paths is not None:
            return list(self._disk_paths)
        paths = ["/" if os.name != "nt" else os.path.abspath(os.sep)]
        store = self._telemetry.store
        if store is not None:
            paths.append(_existing(store.root))
        return paths

    def _build_sources(self) -> list[Source]:
        sources: list[Source] = [ProcessTreeSource(self._process_tree)]  # first: the GPU source uses its pids
        if self._records_host():
            sources.append(HostSource(self._paths()))
            cgroup = find_cgroup_memory()  # a container's memory limit: shared by its ranks, as the host's
            if cgroup is not None:
                sources.append(CgroupMemorySource(cgroup))
        if self._gpus is None or self._gpus == "all" or len(self._gpus) > 0:
            identity = self._telemetry.identity
            distributed = "LOCAL_RANK" in os.environ or identity.world_size > 1
            self._nvml = NvmlSource(self._gpus, identity.local_rank if distributed else None)
            sources.append(self._nvml)
        if self._cuda_allocator:
            sources.append(CudaAllocatorSource(self._nvml.cuda_indices if self._nvml is not None else []))
        return sources
