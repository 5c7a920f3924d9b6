"""The demo's backend flags: each attaches one sink to a demo attempt's Telemetry (``telemetrain demo --prometheus
--otel --tensorboard DIR --mlflow URI``; ``--trace FILE`` exports the session once the demo ends). A backend whose
extra is not installed is skipped with a note naming it; the demo trains either way."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, TextIO

from ..telemetry import Telemetry

__all__ = ["Backends", "attach"]


@dataclasses.dataclass(frozen=True)
class Backends:
    """What to attach (plain values: it travels to the spawned first attempt)."""

    prometheus: bool = False
    otel: bool = False
    tensorboard: str | None = None  # a log directory
    mlflow: str | None = None  # a tracking URI
    trace: str | None = None  # a Chrome trace file for the session, written at the end

    @property
    def any_sink(self) -> bool:
        return self.prometheus or self.otel or self.tensorboard is not None or self.mlflow is not None


def _sink(name: str, backends: Backends) -> Any:
    """The sink for ``name`` (imported here: each is an extra)."""
    if name == "prometheus":
        from ..sinks.prometheus import PrometheusSink

        return PrometheusSink()
    if name == "otel":
        from ..sinks.otel import OTelSink

        return OTelSink()
    if name == "tensorboard":
        from ..sinks.tensorboard import TensorBoardSink

        return TensorBoardSink(backends.tensorboard or "tb-logs")
    from ..sinks.mlflow import MLflowSink

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # the demo's file:// stores (MLflow 3 asks for it)
    return MLflowSink(backends.mlflow, experiment_name="telemetrain-demo")


def attach(t: Telemetry, backends: Backends, out: TextIO) -> None:
    """Attach the asked-for sinks to ``t``; a missing extra or a sink that cannot be built is a note, not an error."""
    chosen = [name for name, on in (("prometheus", backends.prometheus), ("otel", backends.otel),
                                    ("tensorboard", backends.tensorboard is not None),
                                    ("mlflow", backends.mlflow is not None)) if on]
    for name in chosen:
        try:
            sink = _sink(name, backends)
        except ImportError as exc:
            print(f"note: no {name} backend: {exc}", file=out, flush=True)
            continue
        t.add_sink(sink)
        where = " (http://127.0.0.1:<9464 + local rank>/metrics)" if name == "prometheus" else ""
        print(f"backend: {name}{where}", file=out, flush=True)
