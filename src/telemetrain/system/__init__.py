"""System samplers: host, process tree (DataLoader workers included), NVIDIA GPUs and the torch.cuda allocator.

    from telemetrain.system import start_sampler
    start_sampler(interval=5.0)           # the default Telemetry; stopped, with a last sample, at close/exit/SIGTERM

One background thread per process samples every ``interval`` seconds (the first sample at once) into metric records
(run store, console, any sink) and gauges (``telemetrain.stats.registry``), in base units with the unit on the
record; a value that cannot be read is absent, never 0. Names, units and groups: ``names.CATALOGUE`` and
``docs/system.md``.

Needs the ``system`` extra (psutil; nvidia-ml-py for GPUs): ``pip install 'telemetrain[system]'``. Without
nvidia-ml-py, a driver or a GPU, GPU metrics are absent and the reason is recorded once.
"""

from __future__ import annotations

from ..extras import missing_extra

try:
    import psutil  # noqa: F401 - the extra's one hard requirement, checked here so the error names the extra
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise missing_extra("telemetrain.system", "psutil", "system", exc) from None

from .devices import GpuChoice, select_gpus
from .names import CATALOGUE
from .sampler import DEFAULT_INTERVAL_S, Sampler, enable_from_env, get_sampler, start_sampler, stop_sampler

__all__ = [
    "CATALOGUE",
    "DEFAULT_INTERVAL_S",
    "GpuChoice",
    "Sampler",
    "enable_from_env",
    "get_sampler",
    "select_gpus",
    "start_sampler",
    "stop_sampler",
]
