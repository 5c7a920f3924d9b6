"""The sink interface."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..records import PackedSource, unpack_batch


def as_float(value: Any) -> float:
    """A record's value as the float a backend takes: an int beyond a float's range (the run store keeps it exact)
    becomes +-inf, as a float beyond it would be, instead of an ``OverflowError`` that fails the whole batch."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


class Sink:
    """Receives records.

    ``background = True`` (the default) puts the sink behind its own queue and thread: ``write`` is called there with
    batches, never on the training thread. ``background = False`` runs ``handle`` inline, in the caller's thread: only
    for sinks that are cheap and never block. ``kinds`` is the default subscription (``None``: every record kind).

    A sink may raise: the failure is contained, counted and reported by the runner around it.

    ``ranks``: ``"all"`` (the default) or ``"zero"``. A ``"zero"`` sink is attached only in the process of rank 0 of a
    job (``Telemetry.add_sink`` checks the identity): the chatty, human-facing backends (console, MLflow, TensorBoard)
    default to it, so an 8-rank job makes one MLflow run, not eight, while every rank keeps its run-store file.

    Runners call ``write_packed`` with records as they come off the queue (packed, see ``records``); the default
    unpacks them and calls ``write``. A sink may override ``write_packed`` to skip unpacking (the run-store writer).

    ``run_config``: the run's config (``Telemetry(config=...)``, flattened to dotted keys by ``hparams.flatten``),
    set by ``Telemetry.add_sink`` before the first record; the hyperparameter backends log it (MLflow params,
    TensorBoard HParams, OpenTelemetry attributes). ``None`` when the Telemetry has none.
    """

    name: str = "sink"
    background: bool = True
    kinds: frozenset[str] | None = None
    ranks: str = "all"
    run_config: Mapping[str, Any] | None = None

    def write(self, records: Sequence[Any]) -> None:
        """Consume a batch of records, oldest first."""
        raise NotImplementedError

    def write_packed(self, packed: Sequence[tuple[Any, ...]], source: PackedSource) -> None:
        """Consume a batch of packed records (``source`` resolves identity tokens and wall time)."""
        self.write(unpack_batch(packed, source))

    def handle(self, record: Any) -> None:
        """Consume one record (inline sinks)."""
        self.write((record,))

    def flush(self) -> None:
        """Make what was written durable/visible."""

    def close(self) -> None:
        """Release resources. Called once, after a final flush."""

    def after_fork_in_child(self) -> None:
        """Called in a forked child: drop what belongs to the parent (open files, sockets, buffers)."""
