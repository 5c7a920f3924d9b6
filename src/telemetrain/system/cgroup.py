"""The CPU bandwidth limit of this process's cgroup (a container's ``--cpus``, a Kubernetes CPU limit), in CPUs.

OpenTelemetry's ``process.cpu.utilization`` divides CPU time by the elapsed time and "the number of CPUs available to
the process" (https://opentelemetry.io/docs/specs/semconv/system/process-metrics/). In a container limited to 4 CPUs
of a 64-CPU host, a process using all 4 is at its ceiling (the kernel throttles it past that): by the host's count it
would read 6%, so the number available is the quota when there is one, else the affinity's CPUs.

cgroup v2: ``cpu.max`` holds ``$MAX $PERIOD`` (``max`` when unlimited) in the process's cgroup and in each of its
ancestors, every one of which limits it: the least counts
(https://docs.kernel.org/admin-guide/cgroup-v2.html#cpu-interface-files). cgroup v1 (still the hybrid layout of
some hosts): ``cpu.cfs_quota_us`` (``-1`` when unlimited) and ``cpu.cfs_period_us`` in the ``cpu`` hierarchy.
The cgroup path is the one ``/proc/self/cgroup`` names; inside a container that shows the host's path while its
cgroup is mounted at the root, a path that does not exist under the mount is read from the root.
"""

from __future__ import annotations

import os

__all__ = ["cgroup_cpu_limit"]

CGROUP_ROOT = "/sys/fs/cgroup"
SELF_CGROUP = "/proc/self/cgroup"


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _v2(text: str | None) -> float | None:
    parts = (text or "").split()
    if len(parts) == 2 and parts[0] != "max":
        try:
            quota, period = int(parts[0]), int(parts[1])
        except ValueError:
            return None
        return quota / period if quota > 0 and period > 0 else None
    return None


def _v1(quota_text: str | None, period_text: str | None) -> float | None:
    try:
        quota, period = int(quota_text or ""), int(period_text or "")
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _chain(mount: str, path: str) -> list[str]:
    """The cgroup's directory under ``mount`` and its ancestors up to the mount (a path not there: the mount)."""
    here = os.path.normpath(os.path.join(mount, path.lstrip("/")))
    if os.path.commonpath((here, mount)) != mount or not os.path.isdir(here):
        here = mount
    out = [here]
    while here != mount and len(here) > len(mount):
        here = os.path.dirname(here)
        out.append(here)
    return out


def cgroup_cpu_limit(root: str = CGROUP_ROOT, self_cgroup: str = SELF_CGROUP) -> float | None:
    """CPUs this process's cgroup may use (quota / period, the least along its ancestry), None without a limit or
    where there are no cgroups (not Linux). ``root``: where the cgroup filesystems are mounted; ``self_cgroup``: the
    process's ``/proc/<pid>/cgroup``."""
    text = _read(self_cgroup)
    if text is None:
        return None
    root = os.path.normpath(root)
    limits: list[float] = []
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers and os.path.isfile(os.path.join(root, "cgroup.controllers")):
            limits += [v for d in _chain(root, path) if (v := _v2(_read(os.path.join(d, "cpu.max")))) is not None]
        elif "cpu" in controllers.split(","):
            mount = next((m for m in (os.path.join(root, controllers), os.path.join(root, "cpu"))
                          if os.path.isdir(m)), None)
            if mount is not None:
                limits += [v for d in _chain(mount, path) if (v := _v1(_read(os.path.join(d, "cpu.cfs_quota_us")),
                                                                    _read(os.path.join(d, "cpu.cfs_period_us"))))
                           is not None]
    return min(limits) if limits else None
