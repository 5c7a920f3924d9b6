"""The guides' Python snippets and links are true: every snippet parses and its ``telemetrain`` imports resolve, every
relative link lands on a file and heading, and the snippets a user can paste as they stand (given the names they
take for granted: a model, a loader, a run folder) run against the real library and run store, in fresh processes."""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDES = [ROOT / "README.md", *(ROOT / "docs" / f"{n}.md" for n in (
    "training", "system", "distributed", "goodput", "report", "format", "integrations", "scale", "compare", "compat")),
    *sorted((ROOT / "docs" / "backends").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def _python(path: Path) -> list[tuple[int, str]]:
    """(line, code) of each Python code block of a guide."""
    text = path.read_text(encoding="utf-8")
    return [(text[:m.start()].count("\n") + 1, m.group(2)) for m in FENCE.finditer(text) if m.group(1) == "python"]


def _snippet(name: str, starts: str) -> str:
    """The one Python block of guide ``name`` whose first line starts with ``starts``."""
    found = [code for _, code in _python(ROOT / name) if code.startswith(starts)]
    assert len(found) == 1, f"{name}: {len(found)} Python blocks start with {starts!r}"
    return found[0]


def test_every_python_snippet_parses_and_its_telemetrain_imports_resolve() -> None:
    missing = []
    for path in GUIDES:
        for line, code in _python(path):
            where = f"{path.relative_to(ROOT)}:{line}"
            tree = ast.parse(code, where)
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("telemetrain"):
                    assert node.module is not None
                    module = importlib.import_module(node.module)
                    for alias in node.names:
                        if not hasattr(module, alias.name):
                            try:
                                importlib.import_module(f"{node.module}.{alias.name}")
                            except ImportError:
                                missing.append(f"{where}: {node.module}.{alias.name}")
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name.startswith("telemetrain"):
                            importlib.import_module(alias.name)
    assert missing == []


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    found, fenced = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#+ (.*)", line)):
            found.add(_slug(m.group(1)))
    return found


def test_every_relative_link_lands_on_a_file_and_heading() -> None:
    assert _slug("Columnar copy (schema version 3)") == "columnar-copy-schema-version-3"
    broken = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for m in re.finditer(r"\]\(([^)\s]+)\)", path.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", m.group(1)):
                continue
            file, _, anchor = m.group(1).partition("#")
            target = path.parent / file if file else path
            if not target.exists() or (anchor and target.suffix == ".md" and anchor not in _anchors(target)):
                broken.append(f"{path.relative_to(ROOT)}: {m.group(1)}")
    assert broken == []


def _run(tmp_path: Path, code: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRAIN_", "TORCHELASTIC_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    return proc.stdout


# what the snippets take for granted: a model, a loader, a step function, a checkpoint
GIVEN = textwrap.dedent("""
    import json, torch
    from datetime import datetime
    from types import SimpleNamespace
    torch.manual_seed(0)
    _net = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(_net.parameters(), lr=0.1)
    model = lambda batch: _net(batch).pow(2).mean()
    build = lambda: model
    loader = [torch.randn(8, 4) for _ in range(60)]
    batch, ckpt = loader[0], "ckpt.pt"  # no `step`: the loops define their own
    state = SimpleNamespace(step=0)
    load = lambda path: state
    save = lambda path: torch.save(_net.state_dict(), path)
    train_step = lambda batch: model(batch).backward()
""")


def test_the_native_api_snippet_runs(tmp_path: Path) -> None:
    sink = textwrap.dedent("""
        from telemetrain.sinks.base import Sink
        class MySink(Sink):
            def write(self, records): print("MySink", *(r.name for r in records))
    """)
    # the sink subscribes to events of group eval: one is recorded after the snippet's add_sink
    code = _snippet("README.md", "import telemetrain\n\nt = telemetrain.Telemetry(")
    code = code.replace("t.flush();", 't.event("val.done", group="eval"); t.flush();')
    out = _run(tmp_path, sink + code + "\nprint('health', t.health()['dropped'], t.health()['failed'])")
    assert "MySink val.done" in out and "health 0 0" in out
    assert [p.name for p in (tmp_path / "runs").glob("*/*/run.json")] == ["run.json"]


def test_the_stats_and_training_snippets_of_the_readme_run(tmp_path: Path) -> None:
    code = _snippet("README.md", "from telemetrain.stats import")
    code += _snippet("README.md", "from telemetrain import training")
    _run(tmp_path, GIVEN + code + "\nimport telemetrain; telemetrain.close()\n")
    (run,) = (tmp_path / "telemetrain-runs").glob("*/*/run.json")
    assert '"perf_tag": "gpt-small"' in run.read_text()
    saves = [f for f in run.parent.glob("rank-*.jsonl") for line in f.read_text().splitlines()
             if '"save_checkpoint_success"' in line]
    assert len(saves) == 1  # step 0 of 60: the loop's own step, not one every iteration


def test_the_lifecycle_snippets_run_and_their_run_reads_back_with_the_reading_snippets(tmp_path: Path) -> None:
    write = [
        _snippet("README.md", "from telemetrain import metrics"),  # the compat modules, default instance
        _snippet("README.md", "from torch.distributed.elastic import events, metrics"),
        _snippet("README.md", "import torch.monitor"),
        _snippet("docs/training.md", "from telemetrain import training"),
    ]
    _run(tmp_path, GIVEN + "\n".join(write) + "\nimport telemetrain; telemetrain.close()\n")
    (run,) = (tmp_path / "telemetrain-runs").glob("*/*/run.json")
    run_dir, session = run.parent.relative_to(tmp_path), run.parent.parent.relative_to(tmp_path)
    read = [
        _snippet("README.md", "from telemetrain.store import open_run"),
        _snippet("docs/goodput.md", "import json\nfrom telemetrain.training.goodput import"),
        _snippet("docs/report.md", "from telemetrain.report import write_report"),
        _snippet("docs/report.md", "from telemetrain.analysis.findings import"),
        "import telemetrain\n" + _snippet("docs/format.md", "run = telemetrain.store.open_run("),
    ]
    code = "\n".join(read)
    for placeholder in ("<session>/<run_id>", "<session>/<run>"):
        code = code.replace(f"telemetrain-runs/{placeholder}", run_dir.as_posix())
    code = code.replace("telemetrain-runs/<session_tag>", session.as_posix())
    code = code.replace(", ...]", "]").replace("total: ...", "total: None")  # the snippets' elisions
    prelude = (f"from telemetrain.store import open_run\nrun_dir = {run_dir.as_posix()!r}\n"
               "from telemetrain.analysis.findings import FindingsInput, WindowPoint\n"
               "data = FindingsInput(windows=[WindowPoint(rank=0, step=99, iterations=10, iteration_time=0.02)])\n")
    out = _run(tmp_path, prelude + code + "\nprint('goodput', report.goodput, report.runs[0].productive_iterations)"
               "\nprint('saves', sum(r.name == 'save_checkpoint_success' for r in run.records(kinds='event')))"
               "\nprint('reports', [r.attributes['current_iteration'] for r in run.records(kinds='event')"
               " if r.name == 'training_metrics_update'])"
               "\nprint('events', sorted({r.name for r in run.records(kinds='event')}))"
               "\nprint('names', sorted({r.name for r in run.records(kinds='metric')}))")
    assert "goodput" in out and " 60\n" in out  # the loop's 60 iterations, all productive
    # log_every_n_train_iterations=50 over 60 iterations: at 50 completed (current_iteration 49), then the final one
    assert "reports [49, 59]\n" in out
    assert "saves 1\n" in out  # step 0 only: the loop's own step, not one every iteration
    events = out.split("events ", 1)[1].split("\n", 1)[0]
    for name in ("checkpoint.saved", "ckpt", "epoch"):  # events.record, torchelastic's record, torch.monitor's
        assert f"'{name}'" in events
    names = out.split("names ", 1)[1]
    for name in ("loss", "batches", "train.samples_per_second", "train.iterations"):
        assert f"'{name}'" in names
    assert (tmp_path / "out.html").is_file() and (run.parent / "report.html").is_file()


@pytest.mark.filterwarnings("ignore::telemetrain.TelemetryWarning")  # the two failures are planted
def test_the_diagnostics_a_run_store_gets_are_the_ones_format_md_names(tmp_path: Path) -> None:
    import threading

    import telemetrain
    from telemetrain.sinks.base import Sink
    from telemetrain.stats import Gauge
    from telemetrain.store import open_run

    release = threading.Event()

    class Stuck(Sink):
        name = "stuck"

        def write(self, records: object) -> None:
            release.wait(30)

    t = telemetrain.Telemetry(store=tmp_path, default=False)
    try:
        Gauge("broken", lambda: 1 / 0, interval=None, telemetry=t).read()  # gauge_error
        t.add_sink(Stuck())
        t.metric("x", 1.0)
        assert t.close(timeout=0.5) is False  # the stuck sink is abandoned: sink_abandoned
    finally:
        release.set()
    (run,) = tmp_path.glob("*/*/run.json")
    written = {r.name for r in open_run(run.parent).records(kinds="diagnostic")}
    assert {"gauge_error", "sink_abandoned"} <= written
    row = next(line for line in (ROOT / "docs" / "format.md").read_text(encoding="utf-8").splitlines()
               if line.startswith("| `diagnostic` |"))
    assert [name for name in sorted(written) if f"`{name}`" not in row] == []


def test_format_md_lists_every_column_of_the_reports_table() -> None:
    from telemetrain.store.report_rows import REPORT_FIELDS

    text = (ROOT / "docs" / "format.md").read_text(encoding="utf-8")
    section = text[text.index("**`reports`** (schema version"):text.index("Attribute JSON keeps")]
    section = re.sub(r"\s+", " ", section)
    listed = set(re.findall(r"`(\w+)`", section))
    for aggs, suffix in re.findall(r"`((?:\w+/)+[a-z0-9]+)_(\w+)`", section):  # `avg/p50/..._iteration_time_sec`
        listed |= {f"{agg}_{suffix}" for agg in aggs.split("/")}
    phases = ("dataloader", "h2d", "forward", "backward", "optimizer", "zero_grad")
    for pattern in re.findall(r"`(avg_<phase>_\w+)`", section):
        listed |= {pattern.replace("<phase>", p) for p in phases}
    assert [name for name, _ in REPORT_FIELDS if name not in listed] == []


def test_the_training_names_the_guides_use_resolve_from_a_fresh_import(tmp_path: Path) -> None:
    # `training.flops.flops_per_sample(model, batch)` after `from telemetrain import training`, in a process that has
    # imported nothing else: a submodule the package had not loaded yet must still be reachable
    names = set()
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        names |= set(re.findall(r"`(training(?:\.[A-Za-z_]\w*)+)", path.read_text(encoding="utf-8")))
    names = {n for n in names if not n.endswith(".md")}
    assert "training.flops.flops_per_sample" in names
    code = ("import functools\nfrom telemetrain import training\n"
            f"for name in {sorted(names)!r}:\n"
            "    functools.reduce(getattr, name.split('.')[1:], training)\n"
            "assert not hasattr(training, 'no_such_module')\n")
    _run(tmp_path, code)


def test_the_bridge_and_sampler_snippets_run(tmp_path: Path) -> None:
    code = "\n".join([
        "import telemetrain\nfrom torch.distributed.elastic import events, metrics",  # torch's, as the guide says
        _snippet("docs/distributed.md", "from telemetrain.integrations.torchelastic import install"),
        "t = telemetrain.get_telemetry()",
        _snippet("README.md", "from telemetrain.system import start_sampler"),
        _snippet("docs/system.md", "from telemetrain.system import start_sampler"),  # the same arguments: the same one
        "telemetrain.close()",
    ])
    _run(tmp_path, code)
    (run,) = (tmp_path / "telemetrain-runs").glob("*/*/run.json")
    text = "".join(f.read_text() for f in run.parent.glob("rank-*.jsonl"))
    assert '"name":"batches"' in text and '"name":"ckpt"' in text
    assert text.count('"name":"system.sampler.start"') == 1 and '"name":"system.sampler.stop"' in text


def test_the_query_examples_return_rows_on_the_demos_run(
        launched_demo: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    """A newcomer pastes README's query and format.md's cookbook onto the demo's run: each must find rows there, not
    an empty table (they named a loss 'loss' the demo does not write: its series is train.loss)."""
    pytest.importorskip("duckdb")
    from telemetrain.store.reader import find_runs

    root, proc = launched_demo
    assert proc.returncode == 0, proc.stderr[-2000:]
    first = find_runs(root)[0]  # the preempted attempt: windows, a loss, and a span that did not end ok
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (example,) = re.findall(r'^telemetrain query RUN_DIR "(.*)"$', readme, re.M)
    cookbook = FENCE.findall((ROOT / "docs" / "format.md").read_text(encoding="utf-8"))
    queries = [example, *(code for lang, code in cookbook if lang == "sql")]
    assert len(queries) == 5
    for sql in queries:
        out = subprocess.run([sys.executable, "-m", "telemetrain.cli", "query", str(first), sql, "--format", "json"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout), f"no rows on the demo's run: {sql}"
