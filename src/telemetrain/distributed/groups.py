"""Which process group a collective runs on, so that sequence numbers are counted per group.

A collective on a subgroup (``new_group``, a DeviceMesh dimension) advances only its members' counts: a count per
process differs between ranks of a clean job as soon as they use different groups, and compares nothing. Counted
per group -- torch's ``group_name``, the same on every member (``new_group`` is called by every rank in the same
order, or names the group after its ranks) -- the n-th collective of a group is the same collective on all its
members. Point-to-point operations are counted per pair of ranks (``p2p:<a>,<b>``), which both sides agree on.

Never imports torch: without ``torch.distributed`` loaded (a ``CommMonitor.timed`` block in a process that has no
process group), a collective has no group (``""``).
"""

from __future__ import annotations

import itertools
import sys
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from ..analysis.findings.fmt import ranges

__all__ = ["P2P_KINDS", "GroupCounter"]

P2P_KINDS = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv"})  # one peer (or a few), not a group
_NONE = ("", "", 0)


class GroupCounter:
    """Per group: its name, its ranks (as ``0..3``), its size, and the sequence number of its next collective.
    Thread-safe (a collective can start in autograd's thread): counters are ``itertools.count``s."""

    def __init__(self) -> None:
        # id(group) -> (a weak reference to it, what it is): a dict lookup per collective, and a group torch
        # destroyed is neither kept alive nor mistaken for a new one at the same address
        self._known: dict[int, tuple[Callable[[], Any], tuple[str, str, int]]] = {}
        self._counters: dict[str, Callable[[], int]] = {}

    def next(self, group: Any = None, peers: Iterable[int] | None = None) -> tuple[str, str, int, int]:
        """``(name, ranks, size, seq)`` of a collective on ``group`` (``None``: the default group), or of a
        point-to-point operation with ``peers`` (global ranks); ``("", "", 0, seq)`` when there is no group."""
        try:
            name, members, size = self._p2p(peers) if peers is not None else self._describe(group)
        except Exception:  # noqa: BLE001 - a group torch no longer knows (destroyed): counted without one
            name, members, size = _NONE
        counter = self._counters.get(name)
        if counter is None:
            counter = self._counters.setdefault(name, itertools.count(1).__next__)
        return name, members, size, counter()

    def _describe(self, group: Any) -> tuple[str, str, int]:
        dist = sys.modules.get("torch.distributed")
        if dist is None:
            return _NONE
        if group is None:
            group = dist.GroupMember.WORLD  # (None before init_process_group)
            if group is None:
                return _NONE
        known = self._known.get(id(group))
        if known is not None and known[0]() is group:
            return known[1]
        members = dist.get_process_group_ranks(group)
        found = (str(group.group_name), ranges(members), len(members))
        self._known[id(group)] = (weakref.ref(group), found)
        return found

    def _p2p(self, peers: Iterable[int]) -> tuple[str, str, int]:
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_initialized():
            return _NONE
        members = sorted({dist.get_rank(), *peers})
        return "p2p:" + ",".join(map(str, members)), ranges(members), len(members)
