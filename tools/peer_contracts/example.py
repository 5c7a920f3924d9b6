"""Running nv-one-logger's docs/example.py against telemetrain and checking its exports, run store and report."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from .expected import OL_EXAMPLE, ONE_LOGGER_MAPPING, PeerFile
from .rewrite import leftover_imports, resolve, rewrite_source, string_candidates
from .sources import PeerSource

_EXPORT_FILE = "training_telemetry.json"
# what the example's run must export: (record type, span or event name)
_EXAMPLE_EXPORTS = (
    ("start", "application"), ("stop", "application"), ("start", "training_loop"), ("stop", "training_loop"),
    ("start", "checkpoint_save_sync"), ("stop", "checkpoint_save_sync"), ("complete", "loss_calculation_span"),
    ("event", "one_logger_initialization"), ("event", "update_training_telemetry_config"),
    ("event", "training_metrics_update"), ("event", "save_checkpoint_success"),
)


def run_example(
    source: PeerSource, rev: str, scratch: Path, env: Mapping[str, str], timeout: float
) -> tuple[list[str], list[str]]:
    """Run one-logger's example (imports rewritten) in a scratch directory of its own with a run store there; check
    that its spans and events reach the file exporter, the run store and ``telemetrain report``. Returns (facts,
    problems)."""
    work = scratch / "nv-one-logger-example"
    work.mkdir(parents=True, exist_ok=True)
    peer_file = PeerFile(OL_EXAMPLE, rev, "example.py", is_test=False)
    text = source.read(peer_file)
    rewritten = rewrite_source(text, ONE_LOGGER_MAPPING, resolve(string_candidates(text, ONE_LOGGER_MAPPING), env))
    (work / "example.py").write_text(rewritten.text, encoding="utf-8")
    facts: list[str] = []
    problems = [f"example.py: imports not mapped: {m}" for m in leftover_imports(rewritten.text, "nv_one_logger")]
    store = work / "runs"
    run_env = {**env, "TELEMETRAIN_DIR": str(store)}
    try:
        done = subprocess.run(
            [sys.executable, "example.py"], cwd=work, env=run_env, capture_output=True, text=True, timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return facts, [f"example.py ran past {timeout:.0f} s"]
    if done.returncode != 0:
        return facts, [f"example.py exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}"]
    facts.append(f"example.py exited 0 ({len(done.stdout.splitlines())} lines printed)")

    # the file exporter: one JSON object a line, spans (start/stop/complete) and events
    exported = sorted(work.glob("training_telemetry*.json"))
    if not exported:
        problems.append(f"no {_EXPORT_FILE} written by the FileExporter")
    else:
        seen: dict[tuple[str, str], int] = {}
        for path in exported:
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    record = json.loads(line)
                    kind = str(record.get("type"))
                    inner = record.get("event")
                    name = inner.get("name") if kind == "event" and isinstance(inner, dict) else record.get("name")
                    seen[(kind, str(name))] = seen.get((kind, str(name)), 0) + 1
        by_kind: dict[str, int] = {}
        for (kind, _), count in seen.items():
            by_kind[kind] = by_kind.get(kind, 0) + count
        facts.append(
            f"file exporter ({', '.join(p.name for p in exported)}): "
            + ", ".join(f"{kind} {count}" for kind, count in sorted(by_kind.items()))
        )
        missing = [f"{kind} {name}" for kind, name in _EXAMPLE_EXPORTS if (kind, name) not in seen]
        if missing:
            problems.append(f"file exporter: missing {', '.join(missing)}")

    # the run store: `telemetrain show` on it, then `telemetrain report`
    if not store.is_dir() or not any(store.iterdir()):
        problems.append(f"no run store under {store}")
        return facts, problems
    cli = [sys.executable, "-m", "telemetrain.cli"]
    shown = subprocess.run(
        [*cli, "show", str(store)], cwd=work, env=run_env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if shown.returncode != 0:
        problems.append(f"telemetrain show exited {shown.returncode}: {shown.stderr.strip()[-1000:]}")
    else:
        lines = shown.stdout.splitlines()
        records = next((line for line in lines if line.startswith("records")), "")
        facts.append("run store: " + " ".join(records.split()))
        for kind in ("span_start", "span_end", "event", "metric"):
            if f" {kind} " not in records + " ":
                problems.append(f"run store: no {kind} records ({records.strip()!r})")
        events = set(" ".join(lines).split())
        missing = [name for kind, name in _EXAMPLE_EXPORTS if kind == "event" and name not in events]
        if missing:
            problems.append(f"run store: events missing: {', '.join(missing)}")
        training = next((line for line in lines if line.startswith("training ")), "")
        if " 320 iterations" not in training:
            problems.append(f"run store: expected 320 iterations (10 epochs of 32 batches): {training.strip()!r}")
        else:
            facts.append("run store: " + " ".join(training.split()))
    html = work / "report.html"
    reported = subprocess.run(
        [*cli, "report", "-o", str(html), str(store)], cwd=work, env=run_env, capture_output=True, text=True,
        timeout=timeout, check=False,
    )
    if reported.returncode != 0 or not html.is_file():
        problems.append(f"telemetrain report exited {reported.returncode}: {reported.stderr.strip()[-1000:]}")
    else:
        page = html.read_text(encoding="utf-8")
        absent = [name for kind, name in _EXAMPLE_EXPORTS if kind == "event" and name not in page]
        if absent:
            problems.append(f"telemetrain report: {html.name} does not name {', '.join(absent)}")
        facts.append(f"telemetrain report: {html.name}, {len(page):,} bytes, names the example's events")
    return facts, problems

