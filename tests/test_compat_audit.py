"""Drop-in contracts found in an audit of the compat modules: what a user switching by changing an import relies on,
checked against the real torch module where one exists."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch.monitor as tm

from telemetrain import monitor

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _fresh_python(code: str) -> str:
    """Run ``code`` in a new interpreter (module attributes depend on what was imported before)."""
    env = {**os.environ, "PYTHONPATH": SRC}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("prefix", ["torch.distributed.elastic", "telemetrain"])
def test_package_import_exposes_api_and_handlers_submodules(prefix: str) -> None:
    # torch's packages import their .api (and events' .handlers), so code written as ``metrics.api.put_metric``
    # after ``from torch.distributed.elastic import metrics`` alone works; the drop-in must too
    out = _fresh_python(f"""
        from {prefix} import events, metrics
        print(metrics.api.put_metric is metrics.put_metric, events.api.Event is events.Event,
              events.handlers.get_logging_handler is events.get_logging_handler)
    """)
    assert out.split() == ["True", "True", "True"]


@pytest.mark.parametrize("mod", [tm, monitor], ids=["torch", "telemetrain"])
def test_aggregation_prints_as_its_name(mod: object) -> None:
    agg = mod.Aggregation.SUM  # type: ignore[attr-defined]
    assert str(agg) == "Aggregation.SUM"
    assert f"{agg}" == "Aggregation.SUM"
    assert agg.name == "SUM" and int(agg.value) == 4
