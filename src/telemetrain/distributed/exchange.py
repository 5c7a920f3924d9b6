"""A small all-gather among the ranks of a job, apart from the training's own process group.

Our own gloo group, built on a prefix of the job's rendezvous store (torchrun's agent store at ``MASTER_ADDR``:
``MASTER_PORT``, or the default group's store when the training initialised one). A separate group means our
collectives never interleave with the training's, may run in a background thread, and carry their own timeout: a
dead rank makes an exchange fail after ``timeout_s``, never hang. The prefix includes the run id, so the attempts of
a restarted job never read each other's keys.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

__all__ = ["Exchange", "ExchangeError"]

HOST_BYTES = 64
CLOCK_TAG = 0x7E1E  # the p2p tag of the clock round trips (only this group's own traffic, so any fixed tag)
TARGET_RTT_NS = 500_000  # a round trip this short bounds the offset's error at 0.25 ms: no need for more
_DONE = -(2**63)  # sent instead of a clock reading: "no more round trips" (no clock reads this)


class ExchangeError(RuntimeError):
    """The exchange could not be set up, or a collective failed (a rank died or timed out)."""


def _store(timeout: timedelta) -> Any:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        raise ExchangeError("no rendezvous store: MASTER_ADDR/MASTER_PORT are not set and torch.distributed is not "
                            "initialised (start the job with torchrun or `telemetrain launch`)")
    from torch._C._distributed_c10d import TCPStore

    return TCPStore(addr, int(port), is_master=False, timeout=timeout, wait_for_workers=False)


class Exchange:
    """All-gathers fixed-length float64 vectors among ``world_size`` ranks. Build and use it in one thread."""

    def __init__(self, rank: int, world_size: int, key: str, timeout_s: float = 60.0) -> None:
        import torch
        from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo

        self.rank, self.world_size = rank, world_size
        timeout = timedelta(seconds=timeout_s)
        try:
            store = PrefixStore(f"telemetrain/{key}/", _store(timeout))
            self._group: Any = ProcessGroupGloo(store, rank, world_size, timeout)
        except ExchangeError:
            raise
        except Exception as exc:
            raise ExchangeError(f"could not build the exchange group: {type(exc).__name__}: {exc}") from exc
        self._torch = torch

    def allgather(self, values: Sequence[float]) -> list[list[float]]:
        """Every rank's vector, indexed by rank. All ranks must call it with vectors of one length."""
        torch = self._torch
        mine = torch.tensor(list(values), dtype=torch.float64)
        out = [torch.empty_like(mine) for _ in range(self.world_size)]
        try:
            self._group.allgather([out], [mine]).wait()
        except Exception as exc:
            raise ExchangeError(f"all-gather failed: {type(exc).__name__}: {exc}") from exc
        return [t.tolist() for t in out]

    def clock_offset(self, now_ns: Callable[[], int], rounds: int = 4,
                     peers: Sequence[int] | None = None, *, max_rounds: int | None = None,
                     target_rtt_ns: int = TARGET_RTT_NS) -> tuple[int, int, int] | None:
        """This rank's clock minus rank 0's, NTP-style: at least ``rounds`` round trips to rank 0 (which answers each
        with its clock), the one with the shortest round trip kept. On a busy host a round trip can wait for a core,
        so a rank whose best round trip is still above ``target_rtt_ns`` goes on, up to ``max_rounds`` (default 4 x
        ``rounds``), and then tells rank 0 it is done. Returns ``(offset_ns, error_ns, rtt_ns)``: the true offset is
        within ``error_ns`` (half that round trip) of ``offset_ns``. Rank 0 answers the ``peers`` (default: every
        other rank) in turn and returns ``(0, 0, 0)``; a rank not among them returns None at once. Every rank must call
        it, with the same ``rounds``, ``max_rounds`` and ``peers``."""
        torch = self._torch
        if rounds < 1:
            raise ValueError(f"rounds must be at least 1, got {rounds!r}")
        limit = 4 * rounds if max_rounds is None else max_rounds
        if limit < rounds:
            raise ValueError(f"max_rounds ({max_rounds!r}) must be at least rounds ({rounds!r})")
        buf = torch.zeros(1, dtype=torch.int64)
        group = self._group
        chosen = range(1, self.world_size) if peers is None else peers
        if self.rank != 0 and self.rank not in chosen:
            return None
        try:
            if self.rank == 0:
                for peer in chosen:
                    for _ in range(limit):
                        group.recv([buf], peer, CLOCK_TAG).wait()
                        if int(buf[0]) == _DONE:
                            break
                        buf[0] = now_ns()
                        group.send([buf], peer, CLOCK_TAG).wait()
                return 0, 0, 0
            best: tuple[int, int, int] | None = None
            for n in range(1, limit + 1):
                t1 = now_ns()
                buf[0] = t1
                group.send([buf], 0, CLOCK_TAG).wait()
                group.recv([buf], 0, CLOCK_TAG).wait()
                t3 = now_ns()
                rtt = t3 - t1
                if best is None or rtt < best[2]:
                    best = ((t1 + t3) // 2 - int(buf[0]), (rtt + 1) // 2, rtt)
                if n >= rounds and best[2] <= target_rtt_ns and n < limit:
                    buf[0] = _DONE  # rank 0 stops answering this rank
                    group.send([buf], 0, CLOCK_TAG).wait()
                    break
        except Exception as exc:
            raise ExchangeError(f"clock round trip failed: {type(exc).__name__}: {exc}") from exc
        assert best is not None
        return best

    def hosts(self, host: str) -> list[str]:
        """Every rank's host name (cut to 64 bytes)."""
        raw = host.encode("utf-8", "replace")[:HOST_BYTES].ljust(HOST_BYTES, b"\0")
        rows = self.allgather([float(b) for b in raw])
        return [bytes(int(b) for b in row).rstrip(b"\0").decode("utf-8", "replace") for row in rows]
