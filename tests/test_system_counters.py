"""The sampler's counters (I/O bytes, GPU joules) count from each sampler's start: a restart is a new segment, and
``telemetrain show`` and the report add the segments up (``analysis.counter_totals``), on the Python and SQL paths."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import helper_env
from telemetrain.analysis.counter_totals import CounterTotals, merge_lifetimes
from telemetrain.cli import summarize
from telemetrain.report.model import build_model
from telemetrain.show_json import show_dict
from telemetrain.store import open_run
from telemetrain.store.engine import Engine

pytest.importorskip("psutil", reason="telemetrain.system needs psutil (the [system] extra)")

MiB = 1 << 20

# One process of a job: each Sampler it starts (a new one counts from 0, as after start_sampler with other arguments)
# records the given running totals, one per cycle (its first at start, the last at stop), through the sampler's own
# publishing: disk bytes read on the host and the joules of GPU 0.
_PROCESS = textwrap.dedent("""
    import sys, telemetrain
    from telemetrain.system import Sampler

    class Counting:
        name = "counting"
        def __init__(self, values):
            self.values = iter(values)
        def describe(self):
            return {}
        def sample(self, cycle):
            v = next(self.values)
            cycle.add("system", "system.disk.io.read", v * MiB)
            cycle.add("system.gpu.0", "hw.energy", float(v))

    class Counted(Sampler):
        def __init__(self, values, t):
            self.values = values
            super().__init__(t, interval=600, host=False, gpus=[], cuda_allocator=False)
        def _build_sources(self):
            return [Counting(self.values)]

    MiB = 1 << 20
    t = telemetrain.Telemetry(store=sys.argv[1])
    for lifetime in sys.argv[2:]:
        values = [int(v) for v in lifetime.split(",")]
        s = Counted(values, t).start()
        assert s.first_sample.wait(30)
        for _ in values[2:]:
            s.sample_now()
        assert s.stop()
    t.close()
""")


def _process(root: Path, *lifetimes: str) -> None:
    done = subprocess.run([sys.executable, "-c", _PROCESS, str(root), *lifetimes], capture_output=True, text=True,
                          timeout=120, env=helper_env("restarted", "counters"))
    assert done.returncode == 0, done.stderr


def test_a_restart_adds_to_the_io_and_energy_totals(tmp_path: Path) -> None:
    # the job's process ran one sampler, then its restart (same run) two, one after the other
    _process(tmp_path, "0,100,300")
    _process(tmp_path, "0,50", "0,25")
    (run_dir,) = [p.parent for p in tmp_path.glob("*/*/run.json")]
    run = open_run(run_dir)
    assert len(run.processes) == 2
    with Engine([run_dir]) as engine:
        for lines in (summarize(run), summarize(run, engine)):
            text = "\n".join(lines)
            assert re.search(r"i/o +disk read 375\.0 MiB ", text), text  # not the last lifetime's 25 MiB
            assert "energy      375.0 J" in text, text  # not the largest lifetime's 300 J
        for got in (show_dict(run), show_dict(run, engine)):  # --json: the total beside the last lifetime's value
            (disk,) = [s for s in got["system"] if s["name"] == "system.disk.io.read"]
            assert (disk["total"], disk["last"]) == (375 * MiB, 25 * MiB)
        for model in (build_model(run), build_model(run, engine=engine)):
            energy = {label: value for label, value, _ in model.headline}["GPU energy"]
            assert energy.endswith("(375 J)"), energy


def test_lifetimes_at_once_count_once_and_one_after_another_add_up() -> None:
    # two ranks sampling one GPU over the same time measured the same joules; a later attempt adds its own
    assert merge_lifetimes([(0, 10, 50.0), (5, 20, 60.0), (30, 40, 7.0)]) == 67.0
    totals: CounterTotals[str] = CounterTotals()
    for wall, value in enumerate((0.0, 4.0, 9.0, 0.0, 3.0, 2.5, 6.0)):  # two resets: at the 0 and at 2.5
        totals.add("gpu", "pid 1", wall, value)
    assert totals.totals() == {"gpu": 9.0 + 3.0 + 6.0}
