"""A session's goodput as a terminal table: per attempt (restart), productive time against each badput category."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..training.goodput import BADPUT_CATEGORIES, GoodputReport
from .findings.fmt import ranges

BY_RANK_ROWS = 20  # ranks `goodput --by-rank` lists by default: the lowest

__all__ = ["by_rank_entry", "format_goodput", "format_goodput_by_rank", "full_by_rank_entry"]

SESSION_KEYS = ("ranks", "energy")  # the session's (its ranks, its energy account): the same in every rank's report


def by_rank_entry(report: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """One rank's report (``as_dict``) as ``goodput --by-rank --json`` lists it under ``by_rank``: less what is the
    session's and the top level holds already (its ``ranks``, each run's ``ranks``, its ``energy``), left out where
    equal to the top level's (of the run with the same ``run_id``). Each rank repeating the session's ranks made the
    document grow as ranks^2 (130 MB at 2,048 ranks). ``full_by_rank_entry`` puts them back."""
    out = {k: v for k, v in report.items() if not (k in SESSION_KEYS and top.get(k) == v)}
    out.update({k: None for k in SESSION_KEYS if k in top and k not in report})  # absent here, not the top's
    top_runs = {run.get("run_id"): run for run in top.get("runs", ())}
    out["runs"] = [{k: v for k, v in run.items()
                    if not (k == "ranks" and run.get("run_id") in top_runs and top_runs[run["run_id"]].get(k) == v)}
                   for run in report.get("runs", ())]
    return out


def full_by_rank_entry(entry: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """A rank's whole report (``as_dict``) from its ``by_rank`` entry and the document's top level."""
    out = dict(entry)
    for k in SESSION_KEYS:
        if k not in entry and k in top:
            out[k] = top[k]
        elif k == "energy" and k in entry and entry[k] is None:
            del out[k]
    top_runs = {run.get("run_id"): run for run in top.get("runs", ())}
    out["runs"] = [run if "ranks" in run else {**run, "ranks": top_runs[run["run_id"]]["ranks"]}
                   for run in entry.get("runs", ())]
    return out


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 120:
        return f"{value:.3f} s"
    minutes, secs = divmod(value, 60)
    hours, minutes = divmod(int(minutes), 60)
    return f"{hours}h{minutes:02d}m{secs:04.1f}s" if hours else f"{minutes}m{secs:04.1f}s"


def _share(part: float, whole: float) -> str:
    return f"{part / whole:.1%}" if whole > 0 else "-"


def _table(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _iterations(first: int | None, last: int | None) -> str:
    return "-" if first is None or last is None else f"{first}..{last}"


def format_goodput(report: GoodputReport) -> list[str]:
    """Goodput, the badput breakdown and one row per attempt, as lines."""
    wall = report.wall_seconds
    lines = [
        f"session     {report.session_tag}  ({report.session_dir})",
        f"rank        {report.rank} (ranks in the session: {ranges(report.ranks) or 'none'})",
        f"goodput     {report.goodput:.1%}: {_seconds(report.productive_seconds)} productive of "
        f"{_seconds(wall)} wall time" + ("  (approximate)" if report.approximate else ""),
        f"iterations  {report.productive_iterations} productive, {report.lost_iterations} lost (redone or never "
        "checkpointed)",
    ]
    e = report.energy
    if e is not None:
        lines.append(f"energy      {e.energy_J:,.0f} J in training loops (all ranks, each GPU once), "
                     f"{e.wasted_J:,.0f} J ({e.wasted_fraction:.1%}) wasted on lost work"
                     + ("  (approximate)" if e.approximate else ""))
    lines += ["", "breakdown (every second of the session once):"]
    rows: list[tuple[str, ...]] = [("productive", _seconds(report.productive_seconds),
                                    _share(report.productive_seconds, wall))]
    badput = report.badput.as_dict()
    for name in BADPUT_CATEGORIES:
        rows.append((f"badput {name}", _seconds(badput[name]), _share(badput[name], wall)))
    rows.append(("total", _seconds(wall), _share(wall, wall)))
    lines += _table(rows)
    lines += ["", f"attempts ({len(report.runs)}, in restart order):"]
    attempts: list[tuple[str, ...]] = [
        ("#", "run", "status", "iterations", "checkpoint", "productive", "lost", "lost s", "data wait")]
    for r in report.runs:
        checkpoint = "-" if r.last_checkpoint_step is None else f"step {r.last_checkpoint_step}"
        attempts.append((str(r.restart_order), r.run_id, r.status + (" ~" if r.approximate else ""),
                     _iterations(r.first_iteration, r.last_iteration), checkpoint,
                     f"{r.productive_iterations} it, {_seconds(r.productive_seconds)}", f"{r.lost_iterations} it",
                     _seconds(r.lost_seconds), _seconds(r.data_wait_seconds)))
    lines += _table(attempts)
    if any(r.approximate for r in report.runs):
        lines.append("  ~ approximate: a killed (or running) attempt's figures stop at its last report")
    # the session's notes hold each run's already ("run <id>: ..."): listing the runs' again printed each twice
    lines += [f"note: {n}" for n in report.notes]
    return lines


def format_goodput_by_rank(reports: Mapping[int, GoodputReport], max_rows: int = BY_RANK_ROWS) -> list[str]:
    """One row per rank's view: goodput and its largest badput category. Past ``max_rows`` ranks (0: no limit) only
    the ``max_rows`` lowest are listed, with the spread of all: 4,096 rows would hide the few that matter."""
    items = sorted(reports.items())
    shown = items
    if max_rows and len(items) > max_rows:
        lowest = sorted(items, key=lambda kv: (kv[1].goodput, kv[0]))[:max_rows]
        shown = sorted(lowest)
    rows = [("rank", "goodput", "productive", "lost it", "largest badput")]
    for rank, report in shown:
        badput = report.badput.as_dict()
        worst = max(BADPUT_CATEGORIES, key=lambda name: badput[name])
        rows.append((str(rank), f"{report.goodput:.1%}", _seconds(report.productive_seconds),
                     str(report.lost_iterations), f"{worst} {_seconds(badput[worst])}"))
    lowest_item = min(items, key=lambda kv: (kv[1].goodput, kv[0])) if items else None
    title = "by rank (each rank's own timeline):"
    if len(shown) < len(items):
        title = (f"by rank (each rank's own timeline): the {len(shown)} lowest of {len(items)} ranks "
                 "(--max-rows 0: all, --json: every rank)")
    lines = [title, *_table(rows)]
    if lowest_item is not None and len(items) > 1:
        values = sorted(r.goodput for _, r in items)
        lines.append(f"  lowest: rank {lowest_item[0]} at {lowest_item[1].goodput:.1%}; median "
                     f"{_median(values):.1%}, highest {values[-1]:.1%} over {len(items)} ranks")
    return lines


def _median(values: Sequence[float]) -> float:
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2
