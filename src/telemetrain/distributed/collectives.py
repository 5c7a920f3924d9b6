"""Timed ``torch.distributed`` collectives for your own code: same names, same arguments, same return values.

    from telemetrain.distributed import collectives as tdist
    tdist.all_reduce(tensor)                       # instead of torch.distributed.all_reduce(tensor)
    work = tdist.all_gather_into_tensor(out, t, async_op=True)

Each call is timed by the ``CommMonitor`` of the default Telemetry (``comm.comm_monitor``; ``collectives.using(t)``
for another one): a blocking call until it returns, an ``async_op=True`` call until its work's future completes. The
kind is the function's name (``comm_all_reduce_count``...); ``batch_isend_irecv`` is one operation, until every
work it returns completes. Each is numbered in its process group (the ``group`` argument; point-to-point: per pair
of ranks). Opt-in by design: patching ``torch.distributed`` for everyone would also time the collectives of
libraries that do not expect it -- so ``torch.distributed._functional_collectives`` (DTensor, tensor parallelism)
is not timed.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from ..telemetry import Telemetry
from .comm import CommMonitor, _launch, comm_monitor
from .groups import P2P_KINDS

__all__ = [
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "gather",
    "irecv",
    "isend",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "scatter",
    "send",
    "using",
]


_Arg = tuple[int, str] | None  # a tensor argument of a torch.distributed function: its position and its name


def _timed(name: str, payload: _Arg, other: _Arg) -> Callable[..., Any]:
    """A method calling ``torch.distributed.<name>`` timed; ``payload``/``other``: where its tensors are."""

    def call(self: _Collectives, *args: Any, **kwargs: Any) -> Any:
        return self._call(name, payload, other, *args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"``torch.distributed.{name}`` (same arguments, same result), timed by the communication monitor."
    return call


class _Collectives:
    """The timed functions, bound to one monitor (``None``: the default Telemetry's, looked up per call)."""

    def __init__(self, monitor: CommMonitor | None) -> None:
        self._monitor = monitor

    def _call(self, name: str, payload_arg: _Arg, other_arg: _Arg, *args: Any, **kwargs: Any) -> Any:
        import torch.distributed as dist

        fn: Callable[..., Any] = getattr(dist, name)
        payload, other = _argument(payload_arg, args, kwargs), _argument(other_arg, args, kwargs)
        monitor = self._monitor if self._monitor is not None else comm_monitor()
        where = _positions(name, fn)
        group = _argument(where.get("group"), args, kwargs)
        peers = None
        if name in P2P_KINDS:  # counted per pair of ranks: the whole group does not take part
            peers = _peer(dist, where, group, args, kwargs)
        return _launch(monitor, name, payload, other, functools.partial(fn, *args, **kwargs), group=group,
                       peers=peers)

    def batch_isend_irecv(self, p2p_op_list: list[Any]) -> list[Any]:
        """``torch.distributed.batch_isend_irecv`` (same argument, same result: the works), timed as one operation
        (kind ``batch_isend_irecv``, the bytes of every op's tensor) until every returned work has completed."""
        import torch.distributed as dist

        ops = list(p2p_op_list) if isinstance(p2p_op_list, (list, tuple)) else []
        monitor = self._monitor if self._monitor is not None else comm_monitor()
        tensors = [getattr(op, "tensor", None) for op in ops]
        peers = [p for op in ops if isinstance(p := getattr(op, "peer", None), int)]
        group = getattr(ops[0], "group", None) if ops else None
        return _launch(monitor, "batch_isend_irecv", tensors, None,  # type: ignore[no-any-return]
                       functools.partial(dist.batch_isend_irecv, p2p_op_list), group=group, peers=peers)

    # (the tensor arguments follow torch.distributed's signatures, passed by position or by name: the payload, then
    # the other side)
    all_reduce = _timed("all_reduce", (0, "tensor"), None)
    reduce = _timed("reduce", (0, "tensor"), None)
    broadcast = _timed("broadcast", (0, "tensor"), None)
    all_gather = _timed("all_gather", (0, "tensor_list"), (1, "tensor"))
    all_gather_into_tensor = _timed("all_gather_into_tensor", (0, "output_tensor"), (1, "input_tensor"))
    reduce_scatter = _timed("reduce_scatter", (1, "input_list"), (0, "output"))
    reduce_scatter_tensor = _timed("reduce_scatter_tensor", (1, "input"), (0, "output"))
    all_to_all = _timed("all_to_all", (1, "input_tensor_list"), (0, "output_tensor_list"))
    all_to_all_single = _timed("all_to_all_single", (1, "input"), (0, "output"))
    barrier = _timed("barrier", None, None)
    # torch 2.13's names for the two above (which it deprecates), the rooted ones, and point-to-point: a pipeline's
    # send/recv (``isend``/``irecv``: until the work completes; ``recv`` returns the sender's rank, as torch's)
    all_gather_single = _timed("all_gather_single", (0, "output_tensor"), (1, "input_tensor"))
    reduce_scatter_single = _timed("reduce_scatter_single", (1, "input"), (0, "output"))
    gather = _timed("gather", (0, "tensor"), (1, "gather_list"))
    scatter = _timed("scatter", (0, "tensor"), (1, "scatter_list"))
    send = _timed("send", (0, "tensor"), None)
    recv = _timed("recv", (0, "tensor"), None)
    isend = _timed("isend", (0, "tensor"), None)
    irecv = _timed("irecv", (0, "tensor"), None)


_POSITIONS: dict[str, dict[str, tuple[int, str]]] = {}


def _positions(name: str, fn: Callable[..., Any]) -> dict[str, tuple[int, str]]:
    """Where ``fn`` takes its group and its peer (``dst``, ``src``, ``group_dst``, ``group_src``), read once from
    its signature: the positions differ between functions and torch versions."""
    found = _POSITIONS.get(name)
    if found is None:
        params = list(inspect.signature(fn).parameters)
        found = _POSITIONS[name] = {p: (i, p) for i, p in enumerate(params)
                                    if p in ("group", "dst", "src", "group_dst", "group_src")}
    return found


def _peer(dist: Any, where: dict[str, tuple[int, str]], group: Any, args: tuple[Any, ...],
          kwargs: dict[str, Any]) -> list[int]:
    """The other rank of a send/recv, global (``group_dst``/``group_src`` are ranks in ``group``); none for a recv
    from any source."""
    for key in ("dst", "src"):
        value = _argument(where.get(key), args, kwargs)
        if isinstance(value, int):
            return [value]
        value = _argument(where.get(f"group_{key}"), args, kwargs)
        if isinstance(value, int):
            try:
                return [dist.get_global_rank(group if group is not None else dist.GroupMember.WORLD, value)]
            except Exception:  # noqa: BLE001 - torch raises the call's own error when it runs
                return []
    return []


def _argument(where: _Arg, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if where is None:
        return None
    position, name = where
    return args[position] if len(args) > position else kwargs.get(name)


_default = _Collectives(None)
all_reduce = _default.all_reduce
reduce = _default.reduce
broadcast = _default.broadcast
all_gather = _default.all_gather
all_gather_into_tensor = _default.all_gather_into_tensor
reduce_scatter = _default.reduce_scatter
reduce_scatter_tensor = _default.reduce_scatter_tensor
all_to_all = _default.all_to_all
all_to_all_single = _default.all_to_all_single
barrier = _default.barrier
all_gather_single = _default.all_gather_single
reduce_scatter_single = _default.reduce_scatter_single
gather = _default.gather
scatter = _default.scatter
send = _default.send
recv = _default.recv
isend = _default.isend
irecv = _default.irecv
batch_isend_irecv = _default.batch_isend_irecv


def using(telemetry: Telemetry) -> _Collectives:
    """The timed collectives, recorded by ``telemetry``'s monitor."""
    if not isinstance(telemetry, Telemetry):
        raise TypeError(f"telemetry must be a Telemetry, got {type(telemetry).__name__}")
    return _Collectives(comm_monitor(telemetry))
