"""bench_stats.py's checks and output: every reported window is in the run store, the checks, the tables."""

from __future__ import annotations

import json
import math
from collections import Counter
from string import ascii_lowercase
from typing import TYPE_CHECKING, Any

import _method
from _method import RESULTS, row_of
from _stats_state import EMITTED, EMITTED_SAMPLES, EXTRA, KIB

if TYPE_CHECKING:
    from telemetrain import Telemetry


# -- the run store: every reported window is there --------------------------------------------------------------------


def check_store(t: Telemetry) -> dict[str, Any]:
    assert t.store is not None  # main() made it with store=
    path = t.store.path
    windows: Counter[str] = Counter()
    samples: Counter[str] = Counter()
    if path is not None:  # the store opens its file at the first record
        with open(path, "rb") as fh:
            for line in fh:
                if b'"kind":"stat"' not in line:
                    continue
                rec = json.loads(line)
                windows[rec["name"]] += 1
                samples[rec["name"]] += rec["count"]
    missing = {name: (n, windows[name]) for name, n in EMITTED.items() if windows[name] != n}
    wrong = {name: (n, samples[name]) for name, n in EMITTED_SAMPLES.items() if samples[name] != n}
    health = t.health()
    out = {
        "stat_records_in_store": sum(windows.values()),
        "samples_in_store": sum(samples.values()),
        "reported_windows": sum(EMITTED.values()),
        "missing": missing,
        "wrong_sample_counts": wrong,
        "dropped": health["dropped"],
        "failed": health["failed"],
    }
    out["ok"] = not missing and not wrong and not health["dropped"] and not health["failed"]
    return out


# -- checks and output ------------------------------------------------------------------------------------------------


def checks() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def ratio_check(
        cid: str, title: str, row: dict[str, Any] | None, limit: float | None, shared: dict[str, Any] | None = None
    ) -> None:
        """``shared``: a baseline row whose cost both sides include (producing the value): the ratio that is checked
        is then of the costs net of it, i.e. of the add itself; the raw ratio is shown too."""
        if row is None or row.get("ratio") is None:
            out.append({"id": cid, "title": title, "status": "SKIP", "text": "not measured"})
            return
        ratio = row["ratio"]
        net = ""
        if shared is not None:
            base = shared["median_ns"]
            raw_ratio = ratio
            ratio = (row["median_ns"] - base) / (row["peer_median_ns"] - base)
            net = f" net of the shared {base:.1f} ns of `nx()` (raw {raw_ratio:.3f}x)"
        status = "INFO" if limit is None else ("PASS" if ratio <= limit else "FAIL")
        lim = net + ("" if limit is None else f" (limit {limit:g}x)")
        out.append(
            {
                "id": cid,
                "title": title,
                "status": status,
                "ours_ns": row["median_ns"],
                "peer_ns": row["peer_median_ns"],
                "ratio": ratio,
                "best_ratio": best_ratio(row),
                "limit": limit,
                "text": f"{row['median_ns']:.1f} ns vs {row['peer']} {row['peer_median_ns']:.1f} ns "
                f"= {ratio:.3f}x{lim}",
            }
        )

    n = "telemetrain.stats"
    m = "telemetrain.monitor"
    before = len(out)
    ratio_check(
        "1a", "stats.Stat.add(1.0) <= 0.5x torch.monitor", row_of(n, 'Stat(["mean","count"], window=600).add(1.0)'), 0.5
    )
    nx_row = row_of("baseline", "`nx()`: next of a prebuilt list of floats (cycle), the varying rows' value")
    ratio_check(
        "1b",
        "stats.Stat.add(varying) <= 0.5x torch.monitor",
        row_of(n, 'Stat(["mean","count"], window=600).add(nx())'),
        0.5,
        nx_row,
    )
    ratio_check(
        "1c", "monitor.Stat.add(1.0) <= 0.5x torch.monitor", row_of(m, "Stat([MEAN,COUNT], 600s).add(1.0)"), 0.5
    )
    ratio_check(
        "1d",
        "monitor.Stat.add(varying) <= 0.5x torch.monitor",
        row_of(m, "Stat([MEAN,COUNT], 600s).add(nx())"),
        0.5,
        nx_row,
    )
    pairs = {
        "1a": 'telemetrain.stats Stat(["mean","count"]).add(1.0)',
        "1b": 'telemetrain.stats Stat(["mean","count"]).add(nx())',
        "1c": "telemetrain.monitor Stat([MEAN,COUNT]).add(1.0)",
        "1d": "telemetrain.monitor Stat([MEAN,COUNT]).add(nx())",
    }
    for c in out[before:]:
        pr = row_of("paired", pairs[c["id"]])
        if pr is not None and c.get("ratio") is not None:
            c["paired_ratio"] = pr["ratio"]
            c["text"] += f"; paired (interleaved) ratio {pr['ratio']:.3f}x; best/best {c['best_ratio']:.3f}x"
    ratio_check(
        "2a",
        "quantile stat, samples=100, lognormal: vs torch MEAN/COUNT add (information)",
        row_of(n, "Stat([count,mean,p50,p90,p99], samples=100)"),
        None,
    )
    ratio_check(
        "2b",
        "quantile stat, window=600 (histogram), lognormal: vs torch MEAN/COUNT add (information)",
        row_of(n, "Stat([count,mean,p50,p90,p99], window=600)"),
        None,
    )

    for i, th in enumerate(EXTRA["threads"]):
        cid = f"3{ascii_lowercase[i]}"
        per = row_of(th["library"], f"{th['operation']}: per thread")
        ratio = f"; per thread {per['median_ns']:.1f} ns/op" if per else ""
        if per and per.get("ratio") is not None:
            ratio += f" = {per['ratio']:.3f}x torch.monitor's"
        last = th["repeats"][-1]
        got = last.get("sum_sample_count", last.get("count"))
        out.append(
            {
                "id": cid,
                "title": f"exact count, {th['library']}: {th['operation']}",
                "status": "PASS" if th["exact"] else "FAIL",
                "exact": th["exact"],
                "ratio": None if not per else per.get("ratio"),
                "text": f"{len(th['repeats'])} repeats, last: {got:,} of {last['expected']:,} samples{ratio}",
            }
        )

    ratio_check(
        "4a",
        "`with s.time(): pass` <= 2x `with nullcontext(): pass`",
        row_of(n, 'Stat(["mean","count"], window=600): `with s.time(): pass`'),
        2.0,
    )
    ratio_check(
        "4b",
        "@s.time-decorated empty call vs plain call (information)",
        row_of(n, "call of the @s.time-decorated empty function"),
        None,
    )

    for i, mem in enumerate(EXTRA["memory"]):
        out.append(
            {
                "id": f"5{ascii_lowercase[i]}",
                "title": f"memory {mem['scenario']}",
                "status": "PASS" if mem["ok"] else "FAIL",
                "held_bytes": mem["held_bytes"],
                "bound_bytes": mem["bound_bytes"],
                "text": f"held {mem['held_bytes']:,} B ({mem['held_bytes'] / KIB:.1f} KiB), "
                f"peak {mem['peak_bytes']:,} B; bound {mem['bound']}",
            }
        )
    for i, wc in enumerate(EXTRA["window_close"]):
        out.append(
            {
                "id": f"6{ascii_lowercase[i]}",
                "title": f"window close: {wc['window']} (information)",
                "status": "INFO",
                "median_us": wc["median_us"],
                "text": f"{wc['median_us']:.1f} us median, {wc['best_us']:.1f} us best over {wc['windows']} windows",
            }
        )
    store = EXTRA.get("store")
    if isinstance(store, dict):
        out.append(
            {
                "id": "7",
                "title": "every reported window is in the run store (nothing dropped)",
                "status": "PASS" if store["ok"] else "FAIL",
                "text": f"{store['stat_records_in_store']:,} stat records, {store['samples_in_store']:,} samples; "
                f"reported {store['reported_windows']:,}; missing {store['missing'] or 'none'}; wrong counts "
                f"{store['wrong_sample_counts'] or 'none'}; dropped {store['dropped']}, failed {store['failed']}",
            }
        )
    return out


def best_ratio(row: dict[str, Any]) -> float:
    """best / best of a row and its peer row."""
    for p in RESULTS:
        if f"{p['library']} | {p['operation']}" == row["peer"]:
            ratio: float = row["best_ns"] / p["best_ns"]
            return ratio
    return math.nan


def render_table() -> str:
    def cells(r: dict[str, Any]) -> list[str]:
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.3f}x"
        return [ratio, "" if r["peer"] is None else r["peer"].replace("|", "\\|")]

    return _method.render_table([("ratio to peer", "---:"), ("peer", "---")], cells)


def render_memory() -> str:
    lines = [
        "| memory scenario | samples | pending | open window | last closed window | held bytes (tracemalloc) "
        "| samples + buckets bytes (getsizeof) | peak bytes | bound |",
        "|---|---:|---:|---|---|---:|---:|---:|---|",
    ]
    for m in EXTRA["memory"]:
        lines.append(
            f"| {m['scenario']} | {m['samples']:,} | {m['pending']:,} | {m['open_window']} | "
            f"{m['last_closed_window'] or '-'} | {m['held_bytes']:,} | {m['samples_and_buckets_bytes']:,} | "
            f"{m['peak_bytes']:,} | {m['bound']} |"
        )
    return "\n".join(lines)
