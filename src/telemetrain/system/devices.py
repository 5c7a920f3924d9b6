"""Which GPUs this process samples: the devices this rank uses, not every GPU of the node.

Pure logic over NVML's device list (index and UUID), the environment and the caller's choice; ``nvml`` reads the
list, this module decides. Rules, in order:

1. ``gpus=`` given: ``"all"`` (every device NVML sees), CUDA device ordinals (ints, as this process numbers them:
   through ``CUDA_VISIBLE_DEVICES``) or UUIDs (``"GPU-..."``, a unique prefix is enough, as CUDA accepts).
2. torch has already initialised CUDA: its current device (never initialised by us).
3. The visible devices (``CUDA_VISIBLE_DEVICES``, else all): one visible device is this process's; a distributed
   job (``LOCAL_RANK`` set, or world size > 1) takes visible device ``local_rank`` (torchrun's convention,
   ``cuda:LOCAL_RANK``); a single process takes every visible device.

CUDA numbers devices fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, NVML by PCI bus id; on the usual
identical GPUs of a training node the two agree (ties are broken by bus id). Where they might not, pass UUIDs. A
``CUDA_VISIBLE_DEVICES`` entry that CUDA would reject ends the list there, as in CUDA. MIG instances are not sampled
(NVML gives them few of these metrics); the reason says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

__all__ = ["GpuChoice", "parse_visible", "select_gpus"]


@dataclasses.dataclass(frozen=True)
class GpuChoice:
    nvml_index: int
    uuid: str
    cuda_index: int | None  # this process's CUDA ordinal for it, None if it is not visible to this process


def _match_uuid(token: str, uuids: Sequence[str]) -> int | None:
    """Index of the one UUID that ``token`` is a prefix of (with or without ``GPU-``), else None."""
    token = token.strip().lower()
    if not token.startswith("gpu-"):
        token = "gpu-" + token
    hits = [i for i, u in enumerate(uuids) if u.lower().startswith(token)]
    return hits[0] if len(hits) == 1 else None


def parse_visible(value: str | None, uuids: Sequence[str]) -> tuple[list[int], str]:
    """NVML indices of the devices ``CUDA_VISIBLE_DEVICES`` makes visible, in CUDA order, and why the list ends
    early ("" if it does not)."""
    if value is None:
        return list(range(len(uuids))), ""
    out: list[int] = []
    for raw in value.split(","):
        token = raw.strip()
        if not token:
            return out, "" if out else "CUDA_VISIBLE_DEVICES is empty: no GPU is visible to this process"
        if token.upper().startswith("MIG-"):
            return out, f"CUDA_VISIBLE_DEVICES names a MIG instance ({token}); MIG instances are not sampled"
        index: int | None
        if token.lstrip("-").isdigit():
            index = int(token)
            if not 0 <= index < len(uuids):
                return out, f"CUDA_VISIBLE_DEVICES entry {token!r} is not a device ({len(uuids)} found)"
        else:
            index = _match_uuid(token, uuids)
            if index is None:
                return out, f"CUDA_VISIBLE_DEVICES entry {token!r} matches no single device"
        if index in out:
            return out, f"CUDA_VISIBLE_DEVICES lists device {token!r} twice"
        out.append(index)
    return out, ""


def select_gpus(
    uuids: Sequence[str],
    *,
    requested: str | Sequence[int | str] | None,
    cuda_visible: str | None,
    local_rank: int | None,
    torch_device: int | None,
) -> tuple[list[GpuChoice], str]:
    """The devices to sample and, when there are none, the reason. ``uuids``: NVML's devices in index order;
    ``local_rank``: None outside a distributed job; ``torch_device``: torch's current CUDA device if torch has
    initialised CUDA, else None."""
    if not uuids:
        return [], "NVML sees no GPU"
    visible, cut = parse_visible(cuda_visible, uuids)
    cuda_of = {nvml: k for k, nvml in enumerate(visible)}

    def choice(nvml: int) -> GpuChoice:
        return GpuChoice(nvml, uuids[nvml], cuda_of.get(nvml))

    if requested is not None:
        if requested == "all":
            return [choice(i) for i in range(len(uuids))], ""
        assert not isinstance(requested, str)  # checked by the caller
        picked: list[GpuChoice] = []
        for item in requested:
            if isinstance(item, int):
                if not 0 <= item < len(visible):
                    return [], f"gpus: CUDA device {item} is not visible ({len(visible)} visible)"
                nvml = visible[item]
            else:
                found = _match_uuid(item, uuids)
                if found is None:
                    return [], f"gpus: {item!r} matches no single device"
                nvml = found
            if all(c.nvml_index != nvml for c in picked):
                picked.append(choice(nvml))
        return picked, "" if picked else "gpus=[]: GPU sampling turned off"
    if not visible:
        return [], cut or "no GPU is visible to this process"
    if torch_device is not None:
        if 0 <= torch_device < len(visible):
            return [choice(visible[torch_device])], ""
        return [], f"torch's current CUDA device {torch_device} is not among the {len(visible)} visible"
    if len(visible) == 1:
        return [choice(visible[0])], ""
    if local_rank is not None:
        if 0 <= local_rank < len(visible):
            return [choice(visible[local_rank])], ""
        return [], (
            f"local rank {local_rank} has no GPU of its own among the {len(visible)} visible; pass gpus= to choose"
        )
    return [choice(i) for i in visible], ""
