"""``telemetrain show --json``: the figures ``show`` prints, as one JSON object for scripts and CI (what fired, the
throughput and MFU of the last window, the goodput, what was lost), read the same way (``show.read_for_show``)."""

from __future__ import annotations

from typing import Any

from .analysis.findings.fmt import ranges
from .cli_common import iso, json_value
from .phase_times import phase_times
from .store.layout import RUN_META
from .store.reader import Run

__all__ = ["show_dict"]


def show_dict(run: Run, engine: Any = None) -> dict[str, Any]:
    """The run's summary: identity, config, ranks and processes, time, record counts, each metric's and stat's last
    value, system samples, the training figures of the lowest rank that reported (its last report window, as
    recorded), checkpoints, the session's goodput, the distributed diagnosis, the findings and notes, events and
    problems. NaN and infinities are the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``."""
    from .show import read_for_show

    read = read_for_show(run, engine)
    summary = read.summary
    walls = ([summary.start_ns, summary.end_ns] if summary.start_ns is not None and summary.end_ns is not None
             else [p.header["wall_ns"] for p in run.processes if "wall_ns" in p.header])
    start, end = (min(walls), max(walls)) if walls else (None, None)
    meta = run.meta
    out: dict[str, Any] = {
        "run_id": run.run_id, "directory": str(run.path), "session_tag": run.session_tag, "perf_tag": run.perf_tag,
        "run_json": "ok" if meta else ("unreadable" if (run.path / RUN_META).exists() else "missing"),
        "config": meta.get("config") if isinstance(meta.get("config"), dict) else None,
        "workload": meta.get("workload") if isinstance(meta.get("workload"), dict) else None,
        "fingerprint": meta.get("fingerprint"),
        "ranks": list(run.ranks),
        "processes": len(run.processes), "hosts": len({p.identity.host for p in run.processes}),
        "agents": len(run.agents),
        "start": iso(start) if start is not None else None, "end": iso(end) if end is not None else None,
        "duration_s": (end - start) / 1e9 if start is not None and end is not None else None,
        "running": read.running,  # its training loop has not ended and it is still writing
        "records": {"total": summary.records, "by_kind": dict(sorted(summary.by_kind.items()))},
        "metrics": _series(summary.metrics, lambda r: {"last": r.value, "step": r.step, "unit": r.unit or None}),
        "stats": _series(summary.stats, lambda r: {"last": dict(r.values), "unit": r.unit or None}),
        # a counter's total over the sampler's lifetimes besides its last value (the last lifetime's: counter_totals)
        "system": [{"who": who, "group": group, "name": name, "samples": s.count, "mean": s.mean, "max": s.max,
                    "last": s.last, **({"total": summary.counter_totals[(who, group, name)]}
                                       if (who, group, name) in summary.counter_totals else {})}
                   for (who, group), by_name in sorted(summary.system.items()) for name, s in sorted(by_name.items())],
        "training": _training(summary),
        "checkpoints": _checkpoints(summary),
        "goodput": _goodput(run, read.goodput_of) if summary.training_events else None,
        "diagnosis": list(read.diagnosis),
        "findings": [f.as_dict() for f in read.findings.findings],
        "notes": [n.as_dict() for n in read.findings.notes],
        "events": {"total": sum(summary.event_counts.values()),
                   "by_severity": dict(sorted(summary.severities.items())),
                   "counts": [{"group": g, "name": n, "count": c}
                              for (g, n), c in sorted(summary.event_counts.items())]},
        "problems": {
            "torn_lines": run.torn, "corrupt_lines": run.corrupt, "diagnostics": summary.diagnostics,
            "spans_not_ok": sum(n for n, _ in summary.failed_spans.values()),
            "failed_spans": [{"group": g, "name": n, "status": status, "count": count, "ranks": ranges(sorted(rs))}
                             for (g, n, status), (count, rs) in sorted(summary.failed_spans.items())],
            "sink_diagnostics": [{"name": name, "sink": sink, "count": count, "records": records, "message": message}
                                 for (name, sink), (count, records, message)
                                 in sorted(summary.diagnostic_groups.items())],
        },
    }
    return json_value(out)  # type: ignore[no-any-return]


def _series(series: dict[tuple[str, str], Any], last: Any) -> list[dict[str, Any]]:
    """Each (group, name): how many points (windows), and the last record of the lowest rank that recorded it (rank 0
    when it did, as show prints), with how many ranks recorded it."""
    from .show import _shown_rank

    out = []
    for (group, name), s in sorted(series.items()):
        if not s.last_by_rank:
            continue
        rank = _shown_rank(s)
        out.append({"group": group, "name": name, "count": s.count, "samples": s.samples or None, "rank": rank,
                    "ranks": len(s.last_by_rank), **last(s.last_by_rank[rank])})
    return out


def _training(summary: Any) -> dict[str, Any] | None:
    """The lowest reporting rank's last report window (``training_metrics_update``'s attributes, every derived
    figure: iteration-time percentiles, throughput, TFLOP/s, MFU, phase fractions), which clock its phase times are,
    and how many reports and ranks there were."""
    updates = summary.updates_by_rank
    if not updates:
        return None
    rank = min(updates)
    last = dict(updates[rank][1])
    return {"rank": rank, "reports": summary.updates, "ranks_reporting": len(updates),
            "phase_clock": phase_times(last)[1], "checkpoints_saved": summary.saves.get(rank, 0),
            "validation_loops": summary.validations.get(rank, 0), "misuse_errors": summary.errors,
            "last_window": last}


def _checkpoints(summary: Any) -> dict[str, Any] | None:
    from .show import longest_save

    saves = summary.saves_by_step
    if not saves:
        return None
    spans = sum(c.spans for c in saves.values())
    (name, step), worst = longest_save(saves)
    return {"saves": len(saves), "spans": spans, "mean_s": sum(c.total_ns for c in saves.values()) / spans / 1e9,
            "not_ok": sum(c.not_ok for c in saves.values()),
            "longest": {"span": name, "step": step, "rank": worst.slowest_rank, "seconds": worst.slowest_ns / 1e9}}


def _goodput(run: Run, goodput_of: Any) -> dict[str, Any] | None:
    """The session's goodput on rank 0's timeline (``goodput --json``'s object), or why it was not computed."""
    from .show import session_report

    report = session_report(run, goodput_of)
    if report is None:
        return None
    if isinstance(report, Exception):
        return {"error": f"{type(report).__name__}: {report}"}
    return report.as_dict()  # type: ignore[no-any-return]
