"""Crashes and restarts: facts, no statistics. First the cause of a launched job's failure, from the agent's worker
exits (``worker_exits``); then each ``training_loop`` or ``application`` span of this run that ended ``error`` or
``terminated``, or never ended (the process was killed) -- one finding when both spans of the same ranks ended alike;
any other run of the session that goodput classifies ``crash``, ``killed`` or ``interrupted`` (a Ctrl-C: a warning);
and each later run of the session, with where it resumed."""

from __future__ import annotations

from collections.abc import Sequence

from ...span_lifecycle import is_signal_kill, is_user_interrupt
from .fmt import ranges
from .inputs import Attempt, SpanFailure
from .model import Evidence, Finding
from .worker_exits import WorkerExit, exit_finding_text, first_causes, first_failures, meaning

__all__ = ["crashes", "is_user_interrupt"]


def crashes(failures: Sequence[SpanFailure], attempts: Sequence[Attempt],
            exits: Sequence[WorkerExit] = ()) -> list[Finding]:
    findings = exit_findings(exits)
    ended: dict[tuple[str, str, str], set[int]] = {}
    for f in failures:
        what = ("killed (started, never ended)" if f.status == "never ended"
                else "killed by SIGTERM (preempted?)" if is_signal_kill(f.error) else f"ended {f.status}")
        ended.setdefault((f.name, what, f.error), set()).add(f.rank)
    # the training loop and the application it runs in end together: one finding says both
    spans: dict[tuple[str, str, tuple[int, ...]], list[str]] = {}
    for (name, what, error), on in sorted(ended.items(), key=lambda kv: kv[0][0] != "training_loop"):
        spans.setdefault((what, error, tuple(sorted(on))), []).append(name)
    for (what, error, ranks), names in spans.items():
        verb = ("were " if len(names) > 1 else "was ") if what.startswith("killed") else ""
        said = f"{' and '.join(names)} {verb}{what}"
        if is_user_interrupt(error):  # a Ctrl-C stopped it: the user's choice, not a crash (but work may be lost)
            findings.append(Finding(
                "warning", "interrupted", f"interrupted: {' and '.join(names)} stopped by an interrupt (Ctrl-C) on "
                f"rank(s) {ranges(list(ranks))}", f"{said} on {len(ranks)} rank(s): {error}",
                Evidence(ranks=ranks, test="lifecycle span status")))
            continue
        findings.append(Finding("error", "crash", f"crash: {said} on rank(s) {ranges(list(ranks))}",
                                f"{said} on {len(ranks)} rank(s)" + (f": {error}" if error else ""),
                                Evidence(ranks=ranks, test="lifecycle span status")))
    runs = sorted(attempts, key=lambda a: a.restart_order)
    for i, r in enumerate(runs):
        if r.status in ("crash", "interrupted", "killed") and not r.current:
            # its cause, when its launcher agent saw its workers end: the first failure, with what it usually means
            causes = first_causes(first_failures(list(r.exits))) if r.exits else []
            after = f"after iteration {r.last_iteration}" if r.last_iteration is not None else "before any iteration"
            # a Ctrl-C is the user's choice, as for the spans above: a warning, not a crash (work may be lost)
            severity, kind = ("warning", "interrupted") if r.status == "interrupted" else ("error", "crash")
            word = "crashed" if r.status == "crash" else r.status
            findings.append(Finding(
                severity, kind, f"{kind}: run {r.run_id} {word}" + "".join(f"; {who}" for who, _ in causes),
                f"run {r.run_id} (attempt {r.restart_order + 1} of the session) "
                f"{'' if r.status == 'crash' else 'was '}{word} {after}"
                + "".join(f"; {who}, {meaning(lead)}" for who, lead in causes) + f"; its last checkpoint held "
                f"{r.checkpointed_iterations} iteration(s); {r.lost_iterations} iteration(s) lost",
                Evidence(steps=(r.first_iteration, r.last_iteration) if r.first_iteration is not None
                         and r.last_iteration is not None else None, test="goodput's run status")))
        if i > 0:
            prev = runs[i - 1]
            # a run that recorded no iteration (absent: no training lifecycle; killed in its set-up) has no step to
            # name, and one that recorded none of its own starts nowhere: never "iteration None"
            start = f"at iteration {r.first_iteration}" if r.first_iteration is not None else "with no iteration"
            stop = (f"stopped at {prev.last_iteration}" if prev.last_iteration is not None
                    else "had recorded no iteration")
            findings.append(Finding(
                "info", "restart", f"restart: run {r.run_id} after {prev.run_id}",
                f"attempt {r.restart_order + 1} ({r.run_id}, {r.status}) started {start} "
                f"after {prev.run_id} ({prev.status}) {stop}"))
    return findings


def exit_findings(exits: Sequence[WorkerExit]) -> list[Finding]:
    """The cause of a failed job, from the agent's worker exits: the first failure, then what followed."""
    found = exit_finding_text(list(exits))
    if found is None:
        return []
    first = first_failures(list(exits))
    return [Finding("error", "crash", found[0], found[1],
                    Evidence(ranks=tuple(e.rank for e in first),
                             test="the agent's worker exits (its first observed failure)"))]
