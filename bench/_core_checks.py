"""bench_core.py's checks and output: the ratio checks and the tables."""

from __future__ import annotations

import math
from typing import Any

import _method
from _core_state import EXTRA
from _method import row_of

# -- checks and output ----------------------------------------------------------------------------------------------


def checks() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def med(lib: str, op: str) -> float | None:
        r = row_of(lib, op)
        return r["median_ns"] if r else None

    def ratio_check(
        num: int, title: str, ours: float | None, peer: float | None, limit: float, peer_name: str, limit_txt: str
    ) -> None:
        if ours is None or peer is None:
            out.append({"num": num, "title": title, "status": "SKIP", "text": f"{peer_name} not measured"})
            return
        ratio = ours / peer
        status = "PASS" if ratio <= limit else "GAP"
        out.append(
            {
                "num": num,
                "title": title,
                "status": status,
                "ours_ns": ours,
                "peer_ns": peer,
                "ratio": ratio,
                "limit": limit,
                "text": f"{ours:.1f} ns vs {peer_name} {peer:.1f} ns = {ratio:.3f}x (limit {limit_txt})",
            }
        )

    ratio_check(
        1,
        "put_metric to a muted group <= 3x empty call",
        med("telemetrain", "(a)"),
        med("baseline", "empty function call"),
        3.0,
        "empty call",
        "3x",
    )
    ratio_check(
        2,
        "put_metric through async JSONL <= 0.5x torchelastic put_metric (NullMetricHandler)",
        med("telemetrain", "(b)"),
        med("torchelastic", "metrics.put_metric"),
        0.5,
        "torchelastic",
        "0.5x",
    )
    ratio_check(
        3,
        "@prof overhead <= 0.3x torchelastic @prof overhead",
        med("telemetrain", "(c)"),
        med("torchelastic", "@metrics.prof overhead"),
        0.3,
        "torchelastic",
        "0.3x",
    )
    ratio_check(
        4,
        "event to async JSONL <= 1/25 of torchelastic events.record",
        med("telemetrain", "(d)"),
        med("torchelastic", "events.record"),
        1 / 25,
        "torchelastic",
        "1/25 = 0.04x",
    )

    tp, fl = EXTRA.get("throughput"), EXTRA.get("flood")
    title5 = "JSONL sustained >= 300k records/s; flood memory flat (growth < 50 MB) with drops counted"
    if tp is None or fl is None:
        out.append({"num": 5, "title": title5, "status": "SKIP", "text": "throughput or flood not measured"})
    else:
        rate = tp["median_records_per_s"]
        accounted = fl["written"] + fl["dropped"]
        ok_rate = rate >= 300_000 and tp["all_written"]
        ok_mem = fl["rss_peak_growth_mb"] < 50
        ok_drops = fl["dropped"] > 0 and accounted >= fl["offered"]
        status = "PASS" if ok_rate and ok_mem and ok_drops else "GAP"
        why = [
            w
            for ok, w in (
                (ok_rate, "throughput below 300k/s or lines missing"),
                (ok_mem, "RSS growth >= 50 MB"),
                (fl["dropped"] > 0, "no drops counted"),
                (
                    accounted >= fl["offered"],
                    f"{fl['offered'] - accounted:,} records neither written nor counted as dropped",
                ),
            )
            if not ok
        ]
        out.append(
            {
                "num": 5,
                "title": title5,
                "status": status,
                "records_per_s": rate,
                "rss_growth_mb": fl["rss_peak_growth_mb"],
                "dropped": fl["dropped"],
                "text": f"{rate:,.0f} records/s (median of {len(tp['runs'])} runs, all lines written: "
                f"{tp['all_written']}); "
                f"flood: RSS growth {fl['rss_peak_growth_mb']:.1f} MB, {fl['dropped']:,} dropped + "
                f"{fl['written']:,} written = {accounted:,} of {fl['offered']:,} offered"
                + (f" [{'; '.join(why)}]" if why else ""),
            }
        )
    return out


def render_table() -> str:
    base = row_of("baseline", "empty function call")
    base_ns = base["median_ns"] if base else math.nan
    return _method.render_table([("ratio to empty call", "---:")], lambda r: [f"{r['median_ns'] / base_ns:.1f}x"])


def render_writer() -> str:
    lines = []
    tp = EXTRA.get("throughput")
    if tp:
        lines += [
            "| JSONL writer | records | emit s | emit -> flush done s | records/s | bytes | file lines | dropped |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for i, r in enumerate(tp["runs"], 1):
            lines.append(
                f"| throughput run {i} (flush_interval 0.2 s) | {r['n']:,} | {r['emit_s']:.2f} | "
                f"{r['total_s']:.2f} | {r['records_per_s']:,.0f} | {r['bytes']:,} | {r['file_lines']:,} | "
                f"{r['dropped']} |"
            )
    fl = EXTRA.get("flood")
    if fl:
        lines += [
            "",
            "| flood (queue_capacity 10,000) | offered | emit s | written | dropped | diagnostic lines "
            "| bytes | RSS before MB | peak RSS growth MB |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
            f"| put_metric as fast as possible | {fl['offered']:,} | {fl['emit_s']:.2f} | {fl['written']:,} | "
            f"{fl['dropped']:,} | {fl['diagnostic_lines']} | {fl['bytes']:,} | {fl['rss_before_mb']:.1f} | "
            f"{fl['rss_peak_growth_mb']:.1f} |",
        ]
    return "\n".join(lines)
