"""Lightning: ``TelemetrainLogger``, a Lightning ``Logger`` that records what the LightningModule logs.

    from telemetrain.integrations.lightning_logger import TelemetrainLogger
    trainer = Trainer(logger=TelemetrainLogger(), callbacks=[TelemetrainCallback()])   # the callback is optional

- ``self.log(...)`` / ``self.log_dict(...)`` values reach the logger through Lightning's own logger connector
  (already turned into Python numbers, at Lightning's step: the number of optimizer steps taken before the value was
  logged, ``trainer.global_step``'s count as Lightning writes it to every logger) and become metric records of group
  ``group`` (``"default"``: TensorBoard tag and MLflow key are the name, as Lightning's own loggers write them), in
  the run store and every sink, through ``Telemetry.log``;
- ``save_hyperparameters()`` (and the datamodule's) reach ``log_hyperparams`` at the start of ``fit``: a
  ``hyperparameters`` event (``telemetrain.hparams``), flattened to dotted keys: MLflow params, TensorBoard HParams,
  OpenTelemetry attributes and the report's config table;
- ``finalize`` (the end of every ``fit``/``validate``/``test``/``predict``, and after an exception or Ctrl-C) flushes,
  so the store holds everything when the call returns.

Usable alone (values and hyperparameters only) or with ``TelemetrainCallback`` (the training lifecycle, derived
metrics, checkpoints); both record into the default ``Telemetry`` unless given one. Every rank records its own
values (each rank has its own run-store file). ``experiment`` is the ``Telemetry``. Under Lightning's own DDP
launcher the ranks join rank 0's run at the Trainer's first use of the logger once the process group is up
(``lightning_ranks``).

``TelemetrainLogger`` subclasses ``lightning.pytorch.loggers.Logger`` (``pytorch_lightning.loggers.Logger`` when only
the older package is installed); ``logger_class("pytorch_lightning")`` gives the class for the other package.
"""

from __future__ import annotations

import importlib
import os
import sys
from argparse import Namespace
from collections.abc import Mapping
from typing import Any

from ..dispatch import describe, warn_safely
from ..hparams import log_hyperparams
from ..telemetry import Telemetry, check_name, get_telemetry
from .lightning_ranks import LAUNCHER_RANK_VARIABLES, adopt_trainer_ranks, calling_trainer

__all__ = ["PACKAGES", "TelemetrainLogger", "logger_class"]

PACKAGES = ("lightning.pytorch", "pytorch_lightning")

TelemetrainLogger: type  # (declared only: made on first access by __getattr__, on the installed package)


class _LoggerMethods:
    """The logger (the Lightning-free half; ``logger_class`` puts a ``Logger`` base under it)."""

    def __init__(self, telemetry: Telemetry | None = None, *, group: str = "default", prefix: str = "") -> None:
        """``telemetry``: where to record (default: the default ``Telemetry``, at the first value). ``group``: the
        group of the metric records. ``prefix``: put before every metric name (``"<prefix>-<name>"``, as Lightning's
        loggers join it)."""
        if telemetry is not None and not isinstance(telemetry, Telemetry):
            raise TypeError(f"telemetry must be a telemetrain.Telemetry, got {type(telemetry).__name__}")
        self._group = check_name(group, "group")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
        self._prefix = prefix
        self._telemetry = telemetry
        self._given = telemetry is not None
        self._ranks_settled = False  # (lightning_ranks: at the Trainer's first use once the process group is up)
        super().__init__()

    @property
    def telemetry(self) -> Telemetry:
        if self._telemetry is None:
            self._telemetry = get_telemetry()
        if not self._ranks_settled:
            self._settle_ranks(self._telemetry)
        return self._telemetry

    def _settle_ranks(self, telemetry: Telemetry) -> None:
        """Under Lightning's own DDP launcher, rank 0's run and the Trainer's ranks (lightning_ranks), at the first
        use by the Trainer once the process group is up. Not settled by other uses: a rank whose first use is its
        own code (a ``prepare_data`` on local rank 0) still joins the others at the Trainer's next use."""
        try:
            if any(os.environ.get(name) for name in LAUNCHER_RANK_VARIABLES):
                self._ranks_settled = True  # torchrun, SLURM, telemetrain launch: the environment's identity
                return
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()):
                return  # not yet: Lightning makes the group inside fit()
            trainer = calling_trainer(sys._getframe(2))
            if trainer is not None:
                self._ranks_settled = True
                adopt_trainer_ranks(trainer, telemetry)
        except Exception as exc:  # noqa: BLE001 - telemetry never breaks training: each rank keeps a run of its own
            self._ranks_settled = True
            warn_safely(f"telemetrain.integrations.lightning_logger: the ranks of Lightning's launcher were not "
                        f"adopted: {describe(exc)}", stacklevel=3)

    def __getstate__(self) -> dict[str, Any]:
        """``ddp_spawn`` pickles the Trainer, loggers included, to its processes; a ``Telemetry`` (threads, open
        files) cannot go. The default one is left behind: each spawned rank takes its own default, as Lightning's
        ``TensorBoardLogger`` leaves its writer behind. A given one is refused, naming the argument (its sinks and
        store would be lost unseen)."""
        if self._given:
            raise TypeError("telemetry: a TelemetrainLogger given a Telemetry cannot be pickled (ddp_spawn sends the "
                            "loggers to new processes): leave telemetry unset there, or use strategy='ddp'")
        state = self.__dict__.copy()
        state.update(_telemetry=None, _ranks_settled=False)
        return state

    # -- Lightning's Logger interface ------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return "telemetrain"

    @property
    def version(self) -> str:
        return self.telemetry.identity.run_id

    @property
    def save_dir(self) -> str | None:
        run_dir = self.telemetry.run_dir
        return None if run_dir is None else str(run_dir.parent.parent)

    @property
    def log_dir(self) -> str | None:
        run_dir = self.telemetry.run_dir
        return None if run_dir is None else str(run_dir)

    @property
    def experiment(self) -> Telemetry:
        return self.telemetry

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        if self._prefix:
            metrics = {f"{self._prefix}-{k}": v for k, v in metrics.items()}
        self.telemetry.log(metrics, step, group=self._group)

    def log_hyperparams(self, params: Mapping[str, Any] | Namespace | None = None, *args: Any,
                        **kwargs: Any) -> None:
        if params is not None:
            log_hyperparams(params, self.telemetry)

    def save(self) -> None:
        pass  # records are written by the dispatcher, in the background: nothing to do on the training thread

    def finalize(self, status: str) -> None:
        self.telemetry.flush()


# -- the Logger classes ------------------------------------------------------------------------------------------------

_CLASSES: dict[str, type] = {}


def logger_class(package: str = PACKAGES[0]) -> type:
    """``TelemetrainLogger`` on ``package``'s ``Logger`` (``"lightning.pytorch"`` or ``"pytorch_lightning"``)."""
    if package not in PACKAGES:
        raise ValueError(f"package must be one of {', '.join(PACKAGES)}, got {package!r}")
    cls = _CLASSES.get(package)
    if cls is None:
        base = importlib.import_module(f"{package}.loggers").Logger
        cls = _CLASSES[package] = type("TelemetrainLogger", (_LoggerMethods, base), {
            "__module__": __name__,
            "__doc__": f"A {package} Logger recording into telemetrain (telemetrain.integrations.lightning_logger).",
        })
    return cls


def _default_class() -> type:
    for package in PACKAGES:
        try:
            return logger_class(package)
        except ImportError:
            continue
    raise ImportError("TelemetrainLogger needs Lightning: pip install lightning (or pytorch_lightning)")


def __getattr__(name: str) -> Any:
    if name == "TelemetrainLogger":
        return _default_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
