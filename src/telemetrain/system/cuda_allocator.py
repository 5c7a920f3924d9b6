"""torch.cuda's caching allocator, read without initialising CUDA and without a device synchronisation.

``torch.cuda.memory_stats`` reads host-side counters the allocator keeps (no kernel, no sync). It is read only if the
program has imported torch and torch has initialised CUDA itself: the sampler never imports torch (seconds, and
gigabytes of address space) and never creates a CUDA context (hundreds of MB of device memory, and a fork hazard).
Peaks are torch's own: since the process started or the program's last ``torch.cuda.reset_peak_memory_stats()``.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .base import Cycle
from .names import cuda_group

__all__ = ["CudaAllocatorSource", "initialised_cuda"]

# name -> key of torch.cuda.memory_stats()
STATS = {
    "torch.cuda.memory.allocated": "allocated_bytes.all.current",
    "torch.cuda.memory.allocated.peak": "allocated_bytes.all.peak",
    "torch.cuda.memory.reserved": "reserved_bytes.all.current",
    "torch.cuda.memory.reserved.peak": "reserved_bytes.all.peak",
    "torch.cuda.alloc_retries": "num_alloc_retries",
    "torch.cuda.ooms": "num_ooms",
}


def initialised_cuda() -> Any:
    """``torch.cuda`` if the program imported torch and torch initialised CUDA, else None. Imports nothing."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        return cuda if cuda is not None and cuda.is_initialized() else None
    except Exception:  # noqa: BLE001 - a half-imported or unusual torch: no allocator readings
        return None


def current_device() -> int | None:
    """torch's current CUDA device, if torch has initialised CUDA (never initialises it)."""
    cuda = initialised_cuda()
    if cuda is None:
        return None
    try:
        return int(cuda.current_device())
    except Exception:  # noqa: BLE001
        return None


def reader(cuda_index: int, key: str) -> Callable[[], int | None]:
    """A callback gauge's function: one allocator statistic of one device, read now (None while CUDA is not
    initialised)."""

    def read() -> int | None:
        cuda = initialised_cuda()
        if cuda is None:
            return None
        value = cuda.memory_stats(cuda_index).get(key)
        return None if value is None else int(value)

    return read


class CudaAllocatorSource:
    name = "cuda_allocator"

    def __init__(self, cuda_indices: Sequence[int]) -> None:
        self._wanted = list(cuda_indices)  # from the GPU selection; empty: torch's current device

    def describe(self) -> dict[str, Any]:
        return {"cuda_allocator.devices": ",".join(map(str, self._wanted)) or "current"}

    def devices(self, cuda: Any) -> list[int]:
        count = int(cuda.device_count())
        chosen = [k for k in self._wanted if 0 <= k < count]
        return chosen or [int(cuda.current_device())]

    def sample(self, cycle: Cycle) -> None:
        cuda = initialised_cuda()
        if cuda is None:
            return
        devices = cycle.read("cuda_allocator.devices", lambda: self.devices(cuda))
        for k in devices or ():
            stats = cycle.read(f"cuda_allocator cuda:{k}", functools.partial(cuda.memory_stats, k))
            if not stats:
                continue
            group = cuda_group(k)
            for name, key in STATS.items():
                value = stats.get(key)
                cycle.add(group, name, None if value is None else int(value))
