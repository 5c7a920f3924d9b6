"""TensorBoard event files: metrics and stat windows as scalars, the run's hyperparameters as HParams, the run as text.

Needs the ``tensorboard`` extra (``pip install 'telemetrain[tensorboard]'``); neither torch nor TensorFlow.

Layout: one event file per process under ``<logdir>/<run_id>/rank<rank>`` (``run_subdirs=False``: in ``logdir``
itself), so ``tensorboard --logdir <logdir>`` shows each rank of each run as its own TensorBoard run.

Scalars are ``simple_value`` summaries, as torch's ``SummaryWriter.add_scalar`` writes them, so
``EventAccumulator(...).Scalars(tag)`` and every script built on it read them. One tag per series
(TensorBoard groups tags by what precedes the first ``/``):

- a metric record: its series (``semconv.series_key``: ``train.phase.duration/forward``, ``system.disk.io.read``)
  alone for group ``default``, ``system/<device>/<series>`` for group ``system.<device>``
  (``system/gpu.0/hw.gpu.utilization``), else ``<group>/<series>`` (``system/system.cpu.utilization``,
  ``training/train.mfu``);
- a stat window: ``<stat tag>/<aggregation>`` (``default/latency/p99`` is ``latency/p99``).

Step: the record's own; a record without one (system samples, stat windows, a metric logged without a step) is
written at the *global step*, the highest step this process's records have carried so far (the training loop's
derived metrics carry the iteration), so every series lines up on the x axis of the loss.

HParams: the identity, the run's config (``Sink.run_config``), the training config (``config.<field>``) and the
``hyperparameters`` events (``hparams.log_hyperparams``: Lightning's, the HF Trainer's, yours) as one session start,
written at the first record that carries a step (by then a training job has logged them) or at close, whichever
comes first; a session end at close (its status: success, or failure for a process dying of an exception or
SIGTERM). The HParams dashboard shows each metric's last value beside them. Hyperparameters that arrive after the
session start are in the ``run/hparams`` text (TensorBoard keeps the first session start of a run).

Wall time is the record's. Values are float32, as every TensorBoard scalar is: NaN and +-inf are kept, a finite
value beyond float32's range (an int beyond float64's too) becomes +-inf (the run store keeps the exact value).

The records are encoded with TensorBoard's own protos, framed as TFRecords (the framing of TensorBoard's
``RecordWriter``) and written to the file in the dispatcher's thread, once per batch: no second writer thread, an I/O
error reaches the dispatcher (which counts it), and a forked child drops the parent's file without flushing anything
of it. The frame checksum is TensorBoard's masked CRC-32C; TensorBoard computes it in pure Python (~8 us, two per
record: most of this sink's cost, and GIL time taken from the training thread), so the C implementation of
``google-crc32c`` (in the extra) is used when it is installed. Values that share a step and a time (a stat window's
aggregations) travel in one event.
"""

from __future__ import annotations

import itertools
import os
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..extras import missing_extra

try:
    from tensorboard.compat.proto import event_pb2, summary_pb2  # type: ignore[import-untyped]
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import (  # type: ignore[import-untyped]
        masked_crc32c as _tb_masked_crc32c,
    )
    from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2  # type: ignore[import-untyped]
    from tensorboard.plugins.hparams import metadata as hparams_metadata
    from tensorboard.plugins.hparams.summary_v2 import hparams_pb  # type: ignore[import-untyped]
    from tensorboard.plugins.text.summary_v2 import text_pb  # type: ignore[import-untyped]
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise missing_extra("telemetrain.sinks.tensorboard", "tensorboard", "tensorboard", exc) from None

from .. import process_hooks
from ..hparams import finite_or_text, is_hyperparameters
from ..identity import Identity
from ..semconv import series_key
from .base import Sink, as_float

_crc32c: Callable[[bytes], int] | None
try:
    from google_crc32c import value as _crc32c
except ImportError:  # pragma: no cover - the extra installs it; TensorBoard's pure-Python CRC is the fallback
    _crc32c = None

__all__ = ["TensorBoardSink", "metric_tag"]

TRAINING_METRICS_EVENT = "training_metrics_update"
TRAINING_CONFIG_EVENT = "update_training_telemetry_config"
_ENDED = {"failed": api_pb2.STATUS_FAILURE, "killed": api_pb2.STATUS_FAILURE}  # process_hooks.ending() -> status
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


def _hparam(value: Any) -> Any:
    """A config value as an HParams value (str, bool or a number)."""
    return value if type(value) in (str, bool, int, float) else str(value)


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
    """One event file: its descriptor, the global step, the hyperparameters and whether they are written."""

    def __init__(self, directory: Path, identity: Identity, wall_s: float, run_config: Mapping[str, Any]) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{identity.host}.{os.getpid()}.{next(_file_numbers)}"
        self.path = directory / name
        self.fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self.parts: list[bytes] = []  # the framed records of this batch, written in one go
        self.step = 0  # the global step: the highest step seen on a record
        self.start_s = wall_s
        self.last_s = wall_s
        self.trial = f"{identity.run_id}/rank{identity.rank}"
        self.identity = identity
        self.hparams: dict[str, Any] = {f"identity.{f}": getattr(identity, f) for f in _IDENTITY_FIELDS}
        self.hparams.update(run_config)
        self.session_started = False
        self.add(event_pb2.Event(wall_time=wall_s, file_version="brain.Event:2"))
        ident = {f: getattr(identity, f) for f in _IDENTITY_FIELDS}
        self.add_summary(text_pb("run/identity", _markdown_table(ident)), 0, wall_s)

    def set_identity(self, identity: Identity, wall_s: float) -> None:
        """The process's identity changed, not its run or rank (rank 0 learning the world size once the process
        group is up): the same file and global step; the new identity in the HParams (or, once the session start
        is written, in the run/hparams text) and in the run/identity text."""
        old, self.identity = self.identity, identity
        ident = {f: getattr(identity, f) for f in _IDENTITY_FIELDS}
        if ident != {f: getattr(old, f) for f in _IDENTITY_FIELDS}:  # (not for a field not shown: the pid)
            self.add_hparams({f"identity.{k}": v for k, v in ident.items()}, wall_s)
            self.add_summary(text_pb("run/identity", _markdown_table(ident)), self.step, wall_s)

    def add(self, event: Any) -> None:
        self.parts.append(tfrecord(event.SerializeToString()))

    def add_summary(self, summary: Any, step: int, wall_s: float) -> None:
        self.add(event_pb2.Event(wall_time=wall_s, step=step, summary=summary))

    def scalar(self, tag: str, value: float) -> Any:
        """A scalar summary value, ``simple_value`` (float32: NaN and +-inf kept, a finite value past its range ->
        +-inf), as torch's ``SummaryWriter`` writes it: no metadata needed, every reader knows it."""
        return summary_pb2.Summary.Value(tag=tag, simple_value=value)

    def add_scalars(self, values: list[Any], step: int, wall_s: float) -> None:
        """Scalar values that share a step and a time: one event."""
        self.add(event_pb2.Event(wall_time=wall_s, step=step, summary=summary_pb2.Summary(value=values)))

    def add_hparams(self, values: Mapping[str, Any], wall_s: float) -> None:
        """More hyperparameters: into the session start if it is not written yet, else into the run/hparams text."""
        fresh = {k: v for k, v in values.items() if self.hparams.get(k) != v}
        self.hparams.update(values)
        if fresh and self.session_started:
            self.add_summary(text_pb("run/hparams", _markdown_table(fresh)), self.step, wall_s)

    def start_session(self) -> None:
        if not self.session_started:
            self.session_started = True
            hparams = {k: finite_or_text(v) for k, v in self.hparams.items()}
            self.add_summary(hparams_pb(hparams, trial_id=self.trial, start_time_secs=self.start_s), 0, self.start_s)
            self.add_summary(text_pb("run/hparams", _markdown_table(self.hparams)), 0, self.start_s)

    def end_session(self) -> None:
        self.start_session()
        status = _ENDED.get(process_hooks.ending() or "", api_pb2.STATUS_SUCCESS)
        info = plugin_data_pb2.SessionEndInfo(status=status, end_time_secs=self.last_s)
        summary = summary_pb2.Summary()
        summary.value.add(tag=hparams_metadata.SESSION_END_INFO_TAG, tensor=hparams_metadata.NULL_TENSOR,
                          metadata=hparams_metadata.create_summary_metadata(
                              plugin_data_pb2.HParamsPluginData(session_end_info=info)))
        self.add_summary(summary, self.step, self.last_s)

    def write_out(self) -> None:
        """Write the buffered records; on an error they are dropped (the batch is counted as failed), the part
        already written too: a torn record (a full disk, a file size limit) would hide every later one from
        TensorBoard's readers."""
        parts = self.parts
        if not parts or self.fd is None:
            return
        data = memoryview(b"".join(parts))
        parts.clear()
        start = os.lseek(self.fd, 0, os.SEEK_END)
        try:
            while data:
                data = data[os.write(self.fd, data) :]
        except BaseException:
            try:
                os.ftruncate(self.fd, start)
            except OSError:
                pass  # (the error raised below is the one to report)
            raise

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


class TensorBoardSink(Sink):
    """Scalars, HParams and run text in TensorBoard event files under ``logdir`` (see the module doc for the tags)."""

    name = "tensorboard"
    background = True
    ranks = "zero"  # one copy per job, not per rank (Sink.ranks; add_sink(..., ranks="all") to have every rank)
    kinds = frozenset({"metric", "stat", "event"})

    def __init__(self, logdir: str | os.PathLike[str], *, run_subdirs: bool = True) -> None:
        if not isinstance(logdir, (str, os.PathLike)):
            raise TypeError(f"logdir must be a path, got {type(logdir).__name__}")
        self.logdir = Path(logdir)
        self.run_subdirs = bool(run_subdirs)
        # one file per run and rank: an identity that changes otherwise keeps its file (and its global step)
        self._files: dict[tuple[str, int], _EventFile] = {}
        self._tags: dict[tuple[str, str, Any], str] = {}  # (group, name, attributes) -> tag

    def _file(self, record: Any) -> _EventFile:
        ident: Identity = record.identity
        key = (ident.run_id, ident.rank)
        f = self._files.get(key)
        if f is None:
            directory = self.logdir / ident.run_id / f"rank{ident.rank}" if self.run_subdirs else self.logdir
            f = self._files[key] = _EventFile(directory, ident, record.wall_ns / 1e9, self.run_config or {})
        elif f.identity is not ident and f.identity != ident:
            f.set_identity(ident, record.wall_ns / 1e9)
        return f

    def _tag(self, group: str, name: str, attributes: Mapping[str, Any] | None) -> str:
        key = (group, name, tuple(attributes.items()) if attributes else None)
        tag = self._tags.get(key)
        if tag is None:
            if len(self._tags) >= 100_000:  # bounded, whatever names come
                self._tags.clear()
            tag = self._tags[key] = metric_tag(group, series_key(name, attributes))
        return tag

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
        f.last_s = max(f.last_s, wall_s)
        if kind == "metric":
            step = record.step
            if step is None:
                step = f.step
            else:
                if step > f.step:
                    f.step = step
                f.start_session()  # a record with a step: a job that logs hyperparameters has logged them by now
            tag = self._tag(record.group, record.name, record.attributes)
            f.add_scalars([f.scalar(tag, as_float(record.value))], step, wall_s)
        elif kind == "stat":
            base = metric_tag(record.group, record.name)
            values = [f.scalar(f"{base}/{agg}", as_float(v)) for agg, v in record.values.items()]
            f.add_scalars(values, f.step, wall_s)
        elif kind == "event" and record.attributes:
            if is_hyperparameters(record):
                f.add_hparams(record.attributes, wall_s)
            elif record.name == TRAINING_CONFIG_EVENT:
                f.add_summary(text_pb("run/training_config", _markdown_table(record.attributes)), f.step, wall_s)
                f.add_hparams({f"config.{k}": _hparam(v) for k, v in record.attributes.items()}, wall_s)
            elif record.name == TRAINING_METRICS_EVENT:  # its values are metric records of their own (one tag each)
                current = record.attributes.get("current_iteration")
                if type(current) is int and current > f.step:
                    f.step = current
                f.start_session()

    def flush(self) -> None:
        for f in self._files.values():
            f.write_out()

    def close(self) -> None:
        files, self._files = list(self._files.values()), {}
        for f in files:
            try:
                f.end_session()
                f.write_out()
            finally:
                f.close()

    def after_fork_in_child(self) -> None:
        # the descriptors are the parent's files: close our copies, unwritten (the child opens its own on demand)
        for f in self._files.values():
            f.parts.clear()
            f.close()
        self._files = {}
