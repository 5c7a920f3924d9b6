"""Crashes and restarts: facts, no statistics. A ``training_loop`` or ``application`` span of this run that ended
``error`` or ``terminated``, or never ended (the process was killed); any other run of the session that goodput
classifies ``interrupted`` or ``killed``; and each later run of the session, with where it resumed."""

from __future__ import annotations

from collections.abc import Sequence

from .fmt import ranges
from .inputs import Attempt, SpanFailure
from .model import Evidence, Finding

__all__ = ["crashes"]


def crashes(failures: Sequence[SpanFailure], attempts: Sequence[Attempt]) -> list[Finding]:
    ended: dict[tuple[str, str, str], set[int]] = {}
    for f in failures:
        what = "was killed (started, never ended)" if f.status == "never ended" else f"ended {f.status}"
        ended.setdefault((f.name, what, f.error), set()).add(f.rank)
    findings = [Finding("error", "crash", f"crash: {name} {what} on rank(s) {ranges(sorted(ranks))}",
                        f"{name} {what} on {len(ranks)} rank(s)" + (f": {error}" if error else ""),
                        Evidence(ranks=tuple(sorted(ranks)), test="lifecycle span status"))
                for (name, what, error), ranks in sorted(ended.items(), key=lambda kv: kv[0][0] != "training_loop")]
    runs = sorted(attempts, key=lambda a: a.restart_order)
    for i, r in enumerate(runs):
        if r.status in ("interrupted", "killed") and not r.current:
            findings.append(Finding(
                "error", "crash", f"crash: run {r.run_id} {r.status}",
                f"run {r.run_id} (attempt {r.restart_order + 1} of the session) was {r.status} after iteration "
                f"{r.last_iteration}; its last checkpoint held {r.checkpointed_iterations} iteration(s); "
                f"{r.lost_iterations} iteration(s) lost",
                Evidence(steps=(r.first_iteration, r.last_iteration) if r.first_iteration is not None
                         and r.last_iteration is not None else None, test="goodput's run status")))
        if i > 0:
            prev = runs[i - 1]
            findings.append(Finding(
                "info", "restart", f"restart: run {r.run_id} after {prev.run_id}",
                f"attempt {r.restart_order + 1} ({r.run_id}, {r.status}) started at iteration {r.first_iteration} "
                f"after {prev.run_id} ({prev.status}) stopped at {prev.last_iteration}"))
    return findings
