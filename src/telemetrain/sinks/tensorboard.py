"""TensorBoard event files: metrics, stat windows and derived training metrics as scalars, the run as text.

Needs the ``tensorboard`` extra (``pip install 'telemetrain[tensorboard]'``); neither torch nor TensorFlow.

Layout: one event file per process under ``<logdir>/<run_id>/rank<rank>`` (``run_subdirs=False``: in ``logdir``
itself), so ``tensorboard --logdir <logdir>`` shows each rank of each run as its own TensorBoard run.

Tags (TensorBoard groups tags by what precedes the first ``/``):

- a metric record: its name for group ``default``, ``system/<device>/<name>`` for group ``system.<device>``
  (``system/gpu.0/hw.gpu.utilization``), else ``<group>/<name>`` (``system/system.cpu.utilization``,
  ``training/train.mfu``); step: the record's, else a count per tag from 0;
- a stat window: ``<stat tag>/<aggregation>`` (``default/latency/p99`` is ``latency/p99``); step: a count per stat;
- a ``training_metrics_update`` event: ``training_metrics_update/<attribute>`` for each numeric attribute; step:
  its ``current_iteration``;
- the identity as text (``run/identity``) and as hparams; the training config event as text (``run/training_config``).

Wall time is the record's. Values are float32, as every TensorBoard scalar is: NaN and +-inf are kept, a finite
value beyond float32's range becomes +-inf (the run store keeps the exact value).

The records are encoded with TensorBoard's own protos, framed as TFRecords (the framing of TensorBoard's
``RecordWriter``) and written to the file in the dispatcher's thread, once per batch: no second writer thread, an I/O
error reaches the dispatcher (which counts it), and a forked child drops the parent's file without flushing anything
of it. The frame checksum is TensorBoard's masked CRC-32C; TensorBoard computes it in pure Python (~8 us, two per
record: most of this sink's cost, and GIL time taken from the training thread), so the C implementation of
``google-crc32c`` (in the extra) is used when it is installed. Values that share a step and a time (a stat window's
aggregations, a training report's attributes) travel in one event.
"""

from __future__ import annotations

import itertools
import os
import struct
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..extras import missing_extra

try:
    from tensorboard.compat.proto import event_pb2, summary_pb2, types_pb2  # type: ignore[import-untyped]
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import (  # type: ignore[import-untyped]
        masked_crc32c as _tb_masked_crc32c,
    )
    from tensorboard.plugins.hparams.summary_v2 import hparams_pb  # type: ignore[import-untyped]
    from tensorboard.plugins.scalar import metadata as scalar_metadata  # type: ignore[import-untyped]
    from tensorboard.plugins.text.summary_v2 import text_pb  # type: ignore[import-untyped]
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise missing_extra("telemetrain.sinks.tensorboard", "tensorboard", "tensorboard", exc) from None

from ..identity import Identity
from .base import Sink

_crc32c: Callable[[bytes], int] | None
try:
    from google_crc32c import value as _crc32c
except ImportError:  # pragma: no cover - the extra installs it; TensorBoard's pure-Python CRC is the fallback
    _crc32c = None

__all__ = ["TensorBoardSink", "metric_tag"]

TRAINING_METRICS_EVENT = "training_metrics_update"
TRAINING_CONFIG_EVENT = "update_training_telemetry_config"
_IDENTITY_FIELDS = ("run_id", "session_tag", "perf_tag", "rank", "local_rank", "world_size", "host", "role")
_file_numbers = itertools.count()  # two sinks of one process in one directory get two files


def metric_tag(group: str, name: str) -> str:
    """The tag of a metric (or the base of a stat's tags): the name alone in group ``default``; the device groups of
    system samples (``system.gpu.0``) under ``system/``, so all system samples share one TensorBoard section."""
    if group == "default":
        return name
    if group.startswith("system."):
        return f"system/{group[7:]}/{name}"
    return f"{group}/{name}"


def _markdown_table(items: dict[str, Any]) -> str:
    # TensorBoard renders text as (sanitised) markdown: escape what would break the table or start markup
    def cell(v: Any) -> str:
        text = str(v)
        for ch in "\\|`*_[]<>":
            text = text.replace(ch, "\\" + ch)
        return text.replace("\n", " ")

    return "| key | value |\n|---|---|\n" + "\n".join(f"| {cell(k)} | {cell(v)} |" for k, v in items.items())


def _fast_masked_crc32c(data: bytes) -> int:
    assert _crc32c is not None
    crc = _crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF  # TFRecord's mask, as TensorBoard applies it


masked_crc32c: Callable[[bytes], int] = _fast_masked_crc32c if _crc32c is not None else _tb_masked_crc32c
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")


def tfrecord(data: bytes) -> bytes:
    """One TFRecord: length (u64 LE), its masked CRC (u32), the data, the data's masked CRC (u32)."""
    length = _U64.pack(len(data))
    return length + _U32.pack(masked_crc32c(length)) + data + _U32.pack(masked_crc32c(data))


class _EventFile:
    """One event file: its descriptor, the tags that already carry their metadata, the step counters."""

    def __init__(self, directory: Path, identity: Identity, wall_s: float) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{identity.host}.{os.getpid()}.{next(_file_numbers)}"
        self.path = directory / name
        self.fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self.parts: list[bytes] = []  # the framed records of this batch, written in one go
        self.described: set[str] = set()
        self.counters: dict[str, int] = {}
        self.add(event_pb2.Event(wall_time=wall_s, file_version="brain.Event:2"))
        ident = {f: getattr(identity, f) for f in _IDENTITY_FIELDS}
        self.add_summary(text_pb("run/identity", _markdown_table(ident)), 0, wall_s)
        trial = f"{identity.run_id}/rank{identity.rank}"
        self.add_summary(hparams_pb(ident, trial_id=trial, start_time_secs=wall_s), 0, wall_s)

    def add(self, event: Any) -> None:
        self.parts.append(tfrecord(event.SerializeToString()))

    def add_summary(self, summary: Any, step: int, wall_s: float) -> None:
        self.add(event_pb2.Event(wall_time=wall_s, step=step, summary=summary))

    def next_step(self, tag: str) -> int:
        step = self.counters.get(tag, 0)
        self.counters[tag] = step + 1
        return step

    def scalar(self, tag: str, value: float) -> Any:
        """A scalar summary value (float32: NaN and +-inf kept, a finite value past its range -> +-inf)."""
        v = summary_pb2.Summary.Value(tag=tag)
        v.tensor.dtype = types_pb2.DT_FLOAT
        v.tensor.tensor_shape.SetInParent()
        v.tensor.float_val.append(value)
        if tag not in self.described:  # TensorBoard reads a tag's metadata from its first value only
            self.described.add(tag)
            v.metadata.CopyFrom(scalar_metadata.create_summary_metadata(display_name="", description=""))
        return v

    def add_scalars(self, values: list[Any], step: int, wall_s: float) -> None:
        """Scalar values that share a step and a time: one event."""
        self.add(event_pb2.Event(wall_time=wall_s, step=step, summary=summary_pb2.Summary(value=values)))

    def write_out(self) -> None:
        """Write the buffered records; on an error they are dropped (the batch is counted as failed)."""
        parts = self.parts
        if not parts or self.fd is None:
            return
        data = memoryview(b"".join(parts))
        parts.clear()
        while data:
            data = data[os.write(self.fd, data) :]

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


class TensorBoardSink(Sink):
    """Scalars and run text in TensorBoard event files under ``logdir`` (see the module doc for the tags)."""

    name = "tensorboard"
    background = True
    ranks = "zero"  # one copy per job, not per rank (Sink.ranks; add_sink(..., ranks="all") to have every rank)
    kinds = frozenset({"metric", "stat", "event"})

    def __init__(self, logdir: str | os.PathLike[str], *, run_subdirs: bool = True) -> None:
        if not isinstance(logdir, (str, os.PathLike)):
            raise TypeError(f"logdir must be a path, got {type(logdir).__name__}")
        self.logdir = Path(logdir)
        self.run_subdirs = bool(run_subdirs)
        self._files: dict[Identity, _EventFile] = {}

    def _file(self, record: Any) -> _EventFile:
        f = self._files.get(record.identity)
        if f is None:
            ident: Identity = record.identity
            directory = self.logdir / ident.run_id / f"rank{ident.rank}" if self.run_subdirs else self.logdir
            f = self._files[ident] = _EventFile(directory, ident, record.wall_ns / 1e9)
        return f

    def write(self, records: Sequence[Any]) -> None:
        touched: list[_EventFile] = []
        identity: Identity | None = None
        f: _EventFile | None = None
        try:
            for record in records:
                if record.identity is not identity or f is None:  # one identity per process: looked up once a batch
                    identity = record.identity
                    f = self._file(record)
                    if f not in touched:
                        touched.append(f)
                self._add(f, record)
        finally:  # what was encoded before an error is still written
            for tf in touched:
                tf.write_out()

    def _add(self, f: _EventFile, record: Any) -> None:
        kind = record.kind
        wall_s = record.wall_ns / 1e9
        if kind == "metric":
            tag = metric_tag(record.group, record.name)
            step = record.step if record.step is not None else f.next_step(tag)
            f.add_scalars([f.scalar(tag, float(record.value))], step, wall_s)
        elif kind == "stat":
            base = metric_tag(record.group, record.name)
            values = [f.scalar(f"{base}/{agg}", float(v)) for agg, v in record.values.items()]
            f.add_scalars(values, f.next_step(base), wall_s)
        elif kind == "event" and record.attributes:
            if record.name == TRAINING_METRICS_EVENT:
                attrs = record.attributes
                current = attrs.get("current_iteration")
                numeric = [(f"{TRAINING_METRICS_EVENT}/{k}", v) for k, v in attrs.items() if type(v) in (int, float)]
                if type(current) is int:  # bool is not numeric here (``final``)
                    f.add_scalars([f.scalar(tag, float(v)) for tag, v in numeric], current, wall_s)
                else:  # no iteration to step on: a count per tag, as for a metric without a step
                    for tag, v in numeric:
                        f.add_scalars([f.scalar(tag, float(v))], f.next_step(tag), wall_s)
            elif record.name == TRAINING_CONFIG_EVENT:
                f.add_summary(text_pb("run/training_config", _markdown_table(record.attributes)), 0, wall_s)

    def flush(self) -> None:
        for f in self._files.values():
            f.write_out()

    def close(self) -> None:
        files, self._files = list(self._files.values()), {}
        for f in files:
            try:
                f.write_out()
            finally:
                f.close()

    def after_fork_in_child(self) -> None:
        # the descriptors are the parent's files: close our copies, unwritten (the child opens its own on demand)
        for f in self._files.values():
            f.parts.clear()
            f.close()
        self._files = {}
