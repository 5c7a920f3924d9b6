"""MLflow tracking: metrics with their steps, the run's hyperparameters as params, one MLflow run per process.

Needs the ``mlflow`` extra (``pip install 'telemetrain[mlflow]'``: mlflow-skinny, the tracking client alone).

Metric keys, one per series: the series (``semconv.series_key``: the name, ``train.phase.duration/forward`` for a
metric with attributes, ``system.disk.io.read``) for group ``default``; ``system/<series>`` for group ``system`` and
``system/<device>/<series>`` for ``system.<device>`` (``system/gpu.0/hw.gpu.utilization``); else
``<group>/<series>``. A stat window gives ``<key>/<aggregation>``. Steps: the record's; without one (system samples,
stat windows) the *global step*, the highest step this process's records have carried so far, so every series lines
up with the loss. Timestamps: the record's wall time. The derived training metrics are metric records of their own
(``train.*``); the ``training_metrics_update`` event is not logged a second time.

Params: the run's config (``Telemetry(config=...)``, flattened: ``model.layers``), the ``hyperparameters`` events
(``hparams.log_hyperparams``: Lightning's ``save_hyperparameters()``, the HF Trainer's arguments, yours) under their
own keys; ``identity.<field>``; ``config.<attribute>`` for the training config (``update_training_telemetry_config``).

Everything talks to the tracking server from the dispatcher's thread, ``log_batch`` calls of at most
``MAX_METRICS_PER_BATCH`` metrics per batch of records (a later call that fails: ``PartialWriteError``, the records the
earlier ones stored are delivered); the run is created (or attached) there on the first
batch. So a server that is down, or a bad URI, costs training nothing: the batch fails and the dispatcher counts it.
"""

from __future__ import annotations

import bisect
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..extras import missing_extra

try:
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient
    from mlflow.utils.validation import MAX_METRICS_PER_BATCH
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise missing_extra("telemetrain.sinks.mlflow", "mlflow", "mlflow", exc) from None

from .. import process_hooks
from ..containment import PartialWriteError
from ..dispatch import warn_safely
from ..hparams import is_hyperparameters
from ..identity import Identity
from ..semconv import series_key
from .base import Sink, as_float

__all__ = ["MLflowSink", "metric_key"]

TRAINING_METRICS_EVENT = "training_metrics_update"
TRAINING_CONFIG_EVENT = "update_training_telemetry_config"
_IDENTITY_FIELDS = ("run_id", "session_tag", "perf_tag", "rank", "local_rank", "world_size", "host", "role")
# MLflow's limits on a key and a param value (mlflow.utils.validation)
_MAX_KEY = 250
_MAX_PARAM_VALUE = 6000
_BAD_KEY_CHARS = re.compile(r"[^\w.\- /]")  # MLflow's allowed set, less ':' (refused on Windows)


def _clean_key(key: str) -> str:
    """A valid MLflow key: allowed characters only, and a path that normalises to itself."""
    parts = [p if p not in (".", "..") else "_" for p in _BAD_KEY_CHARS.sub("_", key).split("/") if p]
    return "/".join(parts)[:_MAX_KEY] or "_"


def metric_key(group: str, name: str) -> str:
    """The MLflow key of a metric (``name``: its series, ``semconv.series_key``) or the base of a stat's keys."""
    if group == "default":
        key = name
    elif group == "system" or group.startswith("system."):
        key = f"system/{group[7:]}/{name}" if group != "system" else f"system/{name}"
    else:
        key = f"{group}/{name}"
    return _clean_key(key)


def _identity_tags(identity: Identity) -> dict[str, str]:
    return {f"identity.{f}": str(getattr(identity, f))[:_MAX_PARAM_VALUE] for f in _IDENTITY_FIELDS}


class MLflowSink(Sink):
    """Logs to an MLflow run: a new one per process (``experiment_name`` or MLflow's default experiment), or the
    run ``run_id`` (attached: not ended at close unless ``end_run=True``).

    ``tracking_uri``: MLflow's (``http://host:5000``, ``file:///path``; default: ``MLFLOW_TRACKING_URI`` as MLflow
    reads it). ``run_name``: default ``<run_id>`` (``<run_id>-rank<rank>`` when several ranks). ``tags``: extra run
    tags. A run this sink created is ended at close: FINISHED, or KILLED when the process is dying of SIGTERM/SIGINT,
    or exits after one (a preemption, whatever its exit code) or after a Ctrl-C, or FAILED at an exit after an
    uncaught exception or a non-zero ``sys.exit`` (``process_hooks.ending``).
    """

    name = "mlflow"
    background = True
    ranks = "zero"  # one copy per job, not per rank (Sink.ranks; add_sink(..., ranks="all") to have every rank)
    kinds = frozenset({"metric", "stat", "event"})

    def __init__(
        self,
        tracking_uri: str | None = None,
        *,
        experiment_name: str | None = None,
        run_id: str | None = None,
        run_name: str | None = None,
        tags: Mapping[str, str] | None = None,
        end_run: bool | None = None,
    ) -> None:
        for arg, value in (("tracking_uri", tracking_uri), ("experiment_name", experiment_name),
                           ("run_id", run_id), ("run_name", run_name)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{arg} must be a str, got {type(value).__name__}")
        if run_id is not None and experiment_name is not None:
            raise ValueError("give run_id (attach to a run) or experiment_name (create one), not both")
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.run_name = run_name
        self.tags = {str(k): str(v) for k, v in (tags or {}).items()}
        self._given_run_id = run_id
        self.end_run = end_run if end_run is not None else run_id is None
        self._client: MlflowClient | None = None
        self.run_id: str | None = None  # the MLflow run, once created or attached
        self._step = 0  # the global step: the highest step seen on a record
        self._keys: dict[tuple[str, str, Any], str] = {}  # (group, name, attributes) -> key: cheaper than cleaning
        self._params: dict[str, str] = {}  # logged
        self._pending_params: dict[str, str] = {}
        self._changed_warned = False
        self._identity: Identity | None = None  # the one the run's name and identity tags were last given for

    # -- the run ---------------------------------------------------------------------------------------------------

    def _run(self, identity: Identity) -> tuple[MlflowClient, str]:
        if self._client is None:
            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        client = self._client
        if self.run_id is None:
            if self._given_run_id is not None:
                run = client.get_run(self._given_run_id)  # fails here if there is no such run
                run_id = run.info.run_id
                # its params (a resumed job's, an earlier attempt's identity.*): the same value is not sent again, a
                # different one is warned about (MLflow keeps the first) rather than failing every batch that has it
                self._params.update({str(k): str(v) for k, v in run.data.params.items()})
            else:
                run_id = client.create_run(self._experiment_id(client), run_name=self._name(identity),
                                           tags={**_identity_tags(identity), **self.tags}).info.run_id
            self.run_id = run_id
            self._identity = identity
            self._add_params(self.run_config or {})
            self._add_params({f"identity.{f}": getattr(identity, f) for f in _IDENTITY_FIELDS})
            if self._given_run_id is not None:
                client.log_batch(run_id, tags=[RunTag(k, v) for k, v in _identity_tags(identity).items()])
        elif identity is not self._identity:
            self._follow_identity(client, self.run_id, identity)
        return client, self.run_id

    def _follow_identity(self, client: MlflowClient, run_id: str, identity: Identity) -> None:
        """A later ``set_identity`` (the rank and world size learned after the first record): MLflow params cannot
        change, so the ``identity.*`` params keep the first values, while the ``identity.*`` tags and the name of a
        run this sink named follow the new identity."""
        old, self._identity = self._identity, identity
        tags = _identity_tags(identity)
        if old is not None and _identity_tags(old) == tags:
            return
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        if self._given_run_id is None and not self.run_name and old is not None and self._name(old) != self._name(
                identity):
            client.update_run(run_id, name=self._name(identity))

    def _experiment_id(self, client: MlflowClient) -> str:
        name = self.experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME")
        if not name:
            return "0"  # MLflow's Default experiment
        found = client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        try:
            return str(client.create_experiment(name))
        except MlflowException:  # another rank created it meanwhile
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
            return str(found.experiment_id)

    def _name(self, identity: Identity) -> str:
        if self.run_name:
            return self.run_name
        return identity.run_id if identity.world_size == 1 else f"{identity.run_id}-rank{identity.rank}"

    def _add_params(self, params: Mapping[str, Any]) -> None:
        for key, value in params.items():
            k, v = _clean_key(key), str(value)[:_MAX_PARAM_VALUE]
            old = self._params.get(k)
            if old is None:
                self._pending_params[k] = v
            elif old != v and not self._changed_warned:  # MLflow refuses to change a param
                self._changed_warned = True
                warn_safely(f"telemetrain: MLflow param {k!r} changed ({old!r} -> {v!r}); MLflow keeps the first value")

    # -- records ---------------------------------------------------------------------------------------------------

    def _key(self, group: str, name: str, attributes: Mapping[str, Any] | None = None) -> str:
        cache = (group, name, tuple(attributes.items()) if attributes else None)
        key = self._keys.get(cache)
        if key is None:
            if len(self._keys) >= 100_000:  # bounded, whatever names come
                self._keys.clear()
            key = self._keys[cache] = metric_key(group, series_key(name, attributes) if attributes else name)
        return key

    def write(self, records: Sequence[Any]) -> None:
        if not records:
            return
        client, run_id = self._run(records[0].identity)
        metrics: list[Metric] = []
        add = metrics.append
        ends: list[int] = []  # per record: how many metrics the records up to it made
        for r in records:
            ends.append(len(metrics))  # (the previous record's end, replaced below once this one's are added)
            kind = r.kind
            ms = r.wall_ns // 1_000_000
            if kind == "metric":
                key = self._key(r.group, r.name, r.attributes)
                step = r.step
                if step is None:
                    step = self._step
                elif step > self._step:
                    self._step = step
                add(Metric(key=key, value=as_float(r.value), timestamp=ms, step=step))
            elif kind == "stat":
                base = self._key(r.group, r.name)
                for agg, value in r.values.items():
                    add(Metric(key=_clean_key(f"{base}/{agg}"), value=as_float(value), timestamp=ms, step=self._step))
            elif kind == "event" and r.attributes:
                if is_hyperparameters(r):
                    self._add_params(r.attributes)
                elif r.name == TRAINING_CONFIG_EVENT:
                    self._add_params({f"config.{k}": v for k, v in r.attributes.items()})
                elif r.name == TRAINING_METRICS_EVENT:
                    current = r.attributes.get("current_iteration")
                    if type(current) is int and current > self._step:
                        self._step = current
            ends[-1] = len(metrics)
        self._log_metrics(client, run_id, metrics, ends)
        if self._pending_params:
            self._log_params(client, run_id)

    @staticmethod
    def _log_metrics(client: MlflowClient, run_id: str, metrics: list[Metric], ends: list[int]) -> None:
        """One request per ``MAX_METRICS_PER_BATCH`` metrics, as ``log_batch`` splits them itself, but here: when a
        later request fails, the records whose metrics the earlier ones stored are delivered, not failed."""
        for start in range(0, len(metrics), MAX_METRICS_PER_BATCH):
            try:
                client.log_batch(run_id, metrics=metrics[start:start + MAX_METRICS_PER_BATCH])
            except Exception as exc:
                if start == 0:
                    raise
                raise PartialWriteError(bisect.bisect_right(ends, start), exc) from exc

    def _log_params(self, client: MlflowClient, run_id: str) -> None:
        pending = self._pending_params
        try:
            client.log_batch(run_id, params=[Param(k, v) for k, v in pending.items()])
        except MlflowException as exc:
            if exc.error_code == "INVALID_PARAMETER_VALUE":  # a conflict with the run's own params: retrying won't help
                pending.clear()
            raise  # else (server down) they are sent again with the next batch
        self._params.update(pending)
        pending.clear()

    def close(self) -> None:
        client, run_id = self._client, self.run_id
        self._client = None
        if client is not None and run_id is not None and self.end_run:
            # the process's fate, when it is ending: SIGTERM/SIGINT -> KILLED, an uncaught exception -> FAILED
            status = {"killed": "KILLED", "failed": "FAILED"}.get(process_hooks.ending() or "", "FINISHED")
            client.set_terminated(run_id, status)

    def after_fork_in_child(self) -> None:
        # the client's connections are the parent's; a run this sink created is the parent's: the child makes its own
        self._client = None
        if self._given_run_id is None:
            self.run_id = None
            self._params.clear()
            self._identity = None
        self._pending_params.clear()
        self._step = 0
