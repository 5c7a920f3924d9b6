"""Cross-rank aggregation: what the exchange every N iterations costs a 2-rank DDP job on CPU gloo.

Each round launches ``_cross_rank_worker.py`` with ``telemetrain launch --nproc-per-node 2`` in three modes, in an
order that rotates between rounds: ``off`` (no aggregation, what the peers do: rank 0 logs its own view), ``ours``
(telemetrain's aggregator every N iterations, in its sink thread over its own gloo group) and ``inline`` (the
hand-written alternative: ``dist.all_gather_object`` of a summary on the training thread every N iterations). Each
worker times every step after its warm-up; a mode's figure is the median over rounds of the two ranks' mean step time.

Two measures, because the machine is shared: the end-to-end step time ratio to ``off`` (it includes the noise of
the machine, a few percent here), and the direct cost: the CPU time the aggregator's thread spent in exchanges and
recording, per N iterations, as a share of N steps (noise-free, and the figure the issue bounds: < 1% at N=50).

``--scale 2,4,8``: the aggregator's collectives alone at each world size (``_cross_rank_scale_worker.py``, no
training): the all-gather of its vector and the clock estimate (round trips to rank 0, which answers the ranks of an
exchange's slice in turn), median wall time per call over the ranks' medians. Extrapolated to 1,024 ranks by a model
-- gloo's ring all-gather is n-1 hops, an exchange's clock estimate is 64 ranks x 4 round trips -- with the hop and
round trip of the smallest job (a core per rank), and of the largest (ranks outnumbering cores: every hop waits for
a CPU, an upper bound). On a cluster each rank has its cores and the network adds latency instead: a cluster's hop is
what to put in the model.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import _method

DISTS = ("torch", "telemetrain")
HERE = Path(__file__).resolve().parent
WORKER = HERE / "_cross_rank_worker.py"
MODES = ("off", "ours", "inline")


def run_mode(mode: str, steps: int, every: int, work: Path) -> dict[str, Any]:
    out = work / f"{mode}-{os.urandom(3).hex()}"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRAIN_", "TORCHELASTIC_"))}
    env.update({"MODE": mode, "STEPS": str(steps), "EVERY": str(every), "BENCH_OUT": str(out),
                "BENCH_STORE": str(work / "store"), "TELEMETRAIN_CROSS_RANK": "0", "OMP_NUM_THREADS": "1",
                "WARMUP": str(min(100, steps // 4))})
    cmd = [sys.executable, "-m", "telemetrain.cli", "launch", "--nproc-per-node", "2", str(WORKER)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} round failed: {proc.stderr[-2000:]}")
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]
    mean_step = statistics.fmean(statistics.fmean(r["step_s"]) for r in ranks)
    return {
        "mode": mode,
        "mean_step_s": mean_step,
        "exchanges": ranks[0]["exchanges"],
        "exchange_cpu_s": max(r["exchange_cpu_s"] for r in ranks),
        "exchange_wall_s": max(r["exchange_wall_s"] for r in ranks),
        "process_cpu_s": sum(r["process_cpu_s"] for r in ranks),
        "steps_timed": len(ranks[0]["step_s"]),
        "cpu_per_step_s": sum(r["process_cpu_s"] for r in ranks) / (2 * len(ranks[0]["step_s"])),
    }


SCALE_WORKER = HERE / "_cross_rank_scale_worker.py"


def run_scale(world: int, rounds: int, work: Path) -> dict[str, Any]:
    out = work / f"scale-{world}-{os.urandom(3).hex()}"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRAIN_", "TORCHELASTIC_"))}
    env.update({"BENCH_OUT": str(out), "ROUNDS": str(rounds), "TELEMETRAIN_CROSS_RANK": "0",
                "TELEMETRAIN_WATCHDOG": "0", "OMP_NUM_THREADS": "1", "TELEMETRAIN_STORE": "0"})
    cmd = [sys.executable, "-m", "telemetrain.cli", "launch", "--nproc-per-node", str(world), str(SCALE_WORKER)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{world} ranks failed: {proc.stderr[-2000:]}")
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(world)]

    def med(key: str) -> float:
        m: float = statistics.median(statistics.median(r[key]) for r in ranks)
        return m

    return {"world": world, "allgather_ms": med("allgather_wall") * 1e3, "allgather_cpu_ms": med("allgather_cpu") * 1e3,
            "clock_ms": max(statistics.median(r["clock_wall"]) for r in ranks) * 1e3,
            "clock_cpu_rank0_ms": statistics.median(ranks[0]["clock_cpu"]) * 1e3,
            "clock_start_ms": max(statistics.median(r["clock_start_wall"]) for r in ranks) * 1e3,
            "vector_floats": ranks[0]["vector_floats"]}


def main_scale(args: argparse.Namespace) -> int:
    from telemetrain.distributed.cross_rank import CLOCK_PEERS, CLOCK_ROUNDS, CLOCK_ROUNDS_START

    worlds = [int(w) for w in args.scale.split(",")]
    load_before = _method.loadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-cross-rank-scale-") as tmp:
        for world in worlds:
            _method.progress(f"{world} ranks")
            rows.append(run_scale(world, 20 if args.quick else args.scale_rounds, Path(tmp)))
    load_after = _method.loadavg()
    _method.print_header(DISTS, load_before, load_after)
    every, at = args.every, 1024
    print(f"the aggregator's collectives alone (telemetrain launch, gloo, CPU), {args.scale_rounds} calls each; "
          f"a vector of {rows[0]['vector_floats']} floats; the clock estimate at an exchange ({CLOCK_ROUNDS} round "
          f"trips per rank, {CLOCK_PEERS} ranks per exchange in turn) and at the start ({CLOCK_ROUNDS_START}, every "
          "rank)")
    print()
    print("| ranks | all-gather ms (wall) | all-gather CPU ms | clock estimate ms (wall, slowest rank) | rank 0's "
          "CPU in it ms | clock at start ms |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['world']} | {r['allgather_ms']:.3f} | {r['allgather_cpu_ms']:.3f} | {r['clock_ms']:.3f} | "
              f"{r['clock_cpu_rank0_ms']:.3f} | {r['clock_start_ms']:.3f} |")
        _method.RESULTS.append(r)
    # a model from the smallest job (a core per rank: no waiting for a CPU): gloo's ring all-gather takes n-1 hops;
    # the clock estimate, rounds x round trips per rank answered, for at most CLOCK_PEERS ranks per exchange
    base = min(rows, key=lambda r: r["world"])
    hop = base["allgather_ms"] / max(base["world"] - 1, 1)
    trip = base["clock_ms"] / (CLOCK_ROUNDS * max(base["world"] - 1, 1))
    model_ag, model_ck = hop * (at - 1), trip * CLOCK_ROUNDS * min(at - 1, CLOCK_PEERS)
    model_start = trip * CLOCK_ROUNDS_START * (at - 1)
    # and pessimistic: the hop and the round trip as slow as at the largest size measured here, where ranks
    # outnumber the cores and every hop waits for a CPU (a cluster gives each rank its own)
    top = max(rows, key=lambda r: r["world"])
    hop_top = top["allgather_ms"] / max(top["world"] - 1, 1)
    trip_top = top["clock_ms"] / (CLOCK_ROUNDS * max(top["world"] - 1, 1))
    worst_ag, worst_ck = hop_top * (at - 1), trip_top * CLOCK_ROUNDS * min(at - 1, CLOCK_PEERS)
    print()
    print(f"at {at} ranks, modelled from {base['world']} ranks (a core each): all-gather {model_ag:.0f} ms "
          f"({at - 1} hops of {hop * 1e3:.0f} us), clock estimate {model_ck:.0f} ms per exchange ({CLOCK_PEERS} ranks "
          f"x {CLOCK_ROUNDS} round trips of {trip * 1e3:.0f} us), {model_start / 1e3:.1f} s once at the start")
    print(f"at {at} ranks, with the hop and round trip of {top['world']} ranks on {os.cpu_count()} cores "
          f"({hop_top * 1e3:.0f} and {trip_top * 1e3:.0f} us): all-gather {worst_ag:.0f} ms, clock estimate "
          f"{worst_ck:.0f} ms per exchange")
    budget = every * 100.0
    checks = [{
        "id": 1, "title": f"at {at} ranks an exchange (all-gather + clock) takes the aggregator's thread less than the "
                          f"{every} steps of 100 ms between exchanges",
        "status": "PASS" if model_ag + model_ck < budget else "FAIL",
        "text": f"modelled {model_ag + model_ck:.0f} ms (a core per rank), {worst_ag + worst_ck:.0f} ms at this "
                f"machine's oversubscribed hop, against {budget:.0f} ms (the training thread pays none of it)",
    }]
    print()
    _method.print_notes()
    _method.print_checks(checks)
    _method.write_run_json(args.json, DISTS, (load_before, load_after), args, {"rows": rows}, checks)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = _method.parser(__doc__, "one short round (smoke test)")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scale", metavar="N,N,...", help="only the collectives' cost at these world sizes (2,4,8)")
    ap.add_argument("--scale-rounds", type=int, default=200)
    args = _method.parse_args(ap, argv)
    if args.scale:
        return main_scale(args)
    steps, rounds = (300, 1) if args.quick else (args.steps, args.rounds)
    load_before = _method.loadavg()
    by_mode: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="bench-cross-rank-") as tmp:
        for i in range(rounds):
            order = MODES[i % 3:] + MODES[:i % 3]
            for mode in order:
                _method.progress(f"round {i + 1}/{rounds}: {mode}")
                by_mode[mode].append(run_mode(mode, steps, args.every, Path(tmp)))
    load_after = _method.loadavg()
    _method.print_header(DISTS, load_before, load_after)
    print(f"2 ranks (telemetrain launch, gloo, CPU), {steps} steps per round, exchange every {args.every} "
          f"iterations, {rounds} round(s); step times after a warm-up; medians over rounds")
    base = statistics.median(r["mean_step_s"] for r in by_mode["off"])
    rows = []
    print()
    base_cpu = statistics.median(r["cpu_per_step_s"] for r in by_mode["off"])
    print("| mode | mean step ms (median of rounds) | ratio to off | process CPU per step ms | ratio to off | "
          "exchanges | exchange CPU per exchange ms | direct cost, share of N steps | exchange wall per exchange ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for mode in MODES:
        rs = by_mode[mode]
        step = statistics.median(r["mean_step_s"] for r in rs)
        cpu = statistics.median(r["cpu_per_step_s"] for r in rs)
        exchanges = statistics.median(r["exchanges"] for r in rs)
        cpu_per = statistics.median(r["exchange_cpu_s"] / r["exchanges"] for r in rs) if exchanges else 0.0
        wall_per = statistics.median(r["exchange_wall_s"] / r["exchanges"] for r in rs) if exchanges else 0.0
        share = cpu_per / (args.every * step) if exchanges else 0.0
        row = {"mode": mode, "step_ms": step * 1e3, "ratio": step / base, "cpu_ms": cpu * 1e3,
               "cpu_ratio": cpu / base_cpu, "exchanges": exchanges,
               "exchange_cpu_ms": cpu_per * 1e3, "direct_share": share, "exchange_wall_ms": wall_per * 1e3,
               "rounds": [r["mean_step_s"] for r in rs], "cpu_rounds": [r["cpu_per_step_s"] for r in rs]}
        rows.append(row)
        _method.RESULTS.append(row)
        print(f"| {mode} | {step * 1e3:.3f} | {step / base:.3f}x | {cpu * 1e3:.3f} | {cpu / base_cpu:.3f}x | "
              f"{exchanges:.0f} | "
              + (f"{cpu_per * 1e3:.3f} | {share:.3%} | {wall_per * 1e3:.3f} |" if exchanges else "- | - | - |"))
    ours = next(r for r in rows if r["mode"] == "ours")
    checks = [{
        "id": 1, "title": f"the exchange every {args.every} iterations costs < 1% of the step time",
        "status": "PASS" if ours["direct_share"] < 0.01 else "FAIL",
        "text": f"direct cost {ours['direct_share']:.3%} of {args.every} steps "
                f"({ours['exchange_cpu_ms']:.3f} ms CPU per exchange, step {ours['step_ms']:.3f} ms); end to end "
                f"{ours['ratio']:.3f}x of off in wall time, {ours['cpu_ratio']:.3f}x in process CPU time "
                "(machine noise included)",
        "direct_share": ours["direct_share"],
    }]
    print()
    _method.print_notes()
    _method.print_checks(checks)
    _method.write_run_json(args.json, DISTS, (load_before, load_after), args, {"rows": rows}, checks)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
