"""The findings engine on real jobs: the planted-problem suite repeated (precision and recall of every surface), and
the calibration of its thresholds on repeated clean runs (the noise the machine makes, measured).

``--suite N`` runs ``tests/test_findings_planted.py`` N times in a row (fresh jobs each time), collects every
check's score (``$TELEMETRAIN_PLANTED_SCORES``) and prints, per scenario and surface (report, show, tail, compare),
the planted findings found and missed and the findings nobody planted; then precision (found / all named) and recall
(found / planted) overall.

``--calibrate N`` runs N clean single-process jobs and N clean 4-rank jobs (``tests/_findings_job.py``) and prints,
for each rule, the largest effect it saw in them with its thresholds lowered to nothing: the noise its thresholds
must clear (for the slowdown rule, against each of its floors: the effect, the run's noise, the time added per
iteration; and what the rule as shipped named). With ``--planted``, also N runs of each planted slowdown (one
process, 4 ranks): how far above the floors a real slowdown lands. And, for every pair of runs of one kind, the
ratio of their median iteration times, raw and with the contention taken out (what ``compare``'s ``BUSY_RESIDUAL``
must cover).

    python bench/bench_findings.py --suite 3
    python bench/bench_findings.py --calibrate 4
    python bench/bench_findings.py --calibrate 4 --planted
    python bench/bench_findings.py --speed          # the engine alone on 8x2000, 64x500, 1024x50 windows
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))


def suite(times: int) -> int:
    scores: list[dict[str, Any]] = []
    outcomes = []
    for i in range(times):
        with tempfile.NamedTemporaryFile("r", suffix=".jsonl", delete=False) as fh:
            path = fh.name
        env = {**os.environ, "TELEMETRAIN_PLANTED_SCORES": path}
        started = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                 str(TESTS / "test_findings_planted.py")], env=env, capture_output=True, text=True,
                                check=False)
        seconds = time.perf_counter() - started
        last = (result.stdout.strip().splitlines() or ["?"])[-1]
        outcomes.append((i + 1, result.returncode, seconds, last, os.getloadavg()[0]))
        print(f"suite run {i + 1}: exit {result.returncode} in {seconds:.0f} s: {last}", file=sys.stderr)
        for line in result.stdout.splitlines():  # what failed, and why (the assertion's message)
            if line.startswith(("FAILED", "ERROR", "E   ")):
                print(f"    {line[:400]}", file=sys.stderr)
        with open(path, encoding="utf-8") as fh:
            scores += [{**json.loads(line), "run": i + 1} for line in fh if line.strip()]
        os.unlink(path)
    print("| run | pytest | wall | load average after |")
    print("|---|---|---|---|")
    for run, code, seconds, last, load in outcomes:
        print(f"| {run} | {'passed' if code == 0 else 'FAILED'}: {last} | {seconds:.0f} s | {load:.1f} |")
    print()
    table: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # expected, found, extra, checks
    extras: dict[tuple[str, str], list[str]] = defaultdict(list)
    for s in scores:
        row = table[(s["scenario"], s["surface"])]
        row[0] += s["expected"]
        row[1] += s["found"]
        row[2] += len(s["extra"])
        row[3] += 1
        extras[(s["scenario"], s["surface"])] += s["extra"] + [f"MISSED {m}" for m in s["missed"]]
    print("| scenario | surface | checks | planted | found | missed | not planted (false positives) |")
    print("|---|---|---|---|---|---|---|")
    total = [0, 0, 0]
    for (scenario, surface), (expected, found, extra, checks) in sorted(table.items()):
        total[0] += expected
        total[1] += found
        total[2] += extra
        wrong = "; ".join(sorted(set(extras[(scenario, surface)])))
        print(f"| {scenario} | {surface} | {checks} | {expected} | {found} | {expected - found} | {extra}"
              + (f" ({wrong})" if wrong else "") + " |")
    expected, found, extra = total
    precision = found / (found + extra) if found + extra else 1.0
    recall = found / expected if expected else 1.0
    print()
    print(f"**Overall** over {times} suite run(s): {found} of {expected} planted findings named (recall "
          f"{recall:.1%}), {extra} finding(s) not planted (precision {precision:.1%}).")
    return 0 if all(code == 0 for _, code, _, _, _ in outcomes) else 1


# -- calibration -----------------------------------------------------------------------------------------------------


def _input(run_dir: Path) -> Any:
    from telemetrain.analysis.findings import InputBuilder
    from telemetrain.store.reader import open_run

    builder = InputBuilder()
    for log in open_run(run_dir).processes:
        for r in log.records:
            builder.add(r)
    return builder.build()


def _largest(run_dir: Path) -> dict[str, float]:
    """The largest effect each rule saw in a run, its thresholds lowered to (almost) nothing."""
    from telemetrain.analysis.findings import Thresholds
    from telemetrain.analysis.findings.memory import _growth
    from telemetrain.analysis.findings.slowdown import _episodes, job_series, net_series
    from telemetrain.analysis.findings.stats import noise_scale
    from telemetrain.analysis.findings.stragglers import _steps, window_outliers, window_phases

    data = _input(run_dir)
    loose = Thresholds(slowdown_effect=1.0001, slowdown_alpha=0.5, slowdown_min_windows=3, slowdown_noise_z=0.0,
                       slowdown_min_added_s=0.0, slowdown_min_seconds=0.0, straggler_z=0.0,
                       straggler_ratio=1.0001, straggler_min_share=0.0, memory_alpha=0.5, memory_tail_alpha=0.5,
                       memory_min_growth_bytes=0.0, memory_min_growth_fraction=0.0, spike_z=0.0,
                       spike_ratio=1.0001)
    out: dict[str, float] = {}
    points = job_series(data.windows)
    raw = [p.raw for p in points]
    out["slowdown, iteration time (x)"] = max((e.ratio for e in _episodes(raw, points, loose)), default=1.0)
    net = net_series(points)
    if net is not None:
        # the rule's series: every episode the noise made, and how far it got against each of the rule's floors
        episodes = _episodes(net, points, loose)
        sigma = max(noise_scale([math.log(max(v, 1e-12)) for v in net]), 0.01)
        out["slowdown, net of the CPU wait (x)"] = max((e.ratio for e in episodes), default=1.0)
        out["slowdown, net: effect in noise scales (log ratio / sigma)"] = max(
            (math.log(e.ratio) / sigma for e in episodes), default=0.0)
        out["slowdown, net: added per iteration (ms)"] = max(
            ((e.level - e.reference) * 1e3 for e in episodes), default=0.0)
        out["slowdown, net: noise scale sigma of the log series"] = sigma
        # the rule itself, every floor on: what it named in a clean run (must be nothing)
        from telemetrain.analysis.findings.slowdown import slowdowns

        out["slowdown findings (the rule as shipped)"] = float(len(slowdowns(data.windows, Thresholds())[0]))
    steps = _steps(data.windows)
    ratios, zs = [1.0], [0.0]
    for ranks in steps:
        typical = statistics.median([w.iteration_time for w in ranks.values()])
        per_phase: dict[str, dict[int, float]] = {}
        for rank, w in ranks.items():
            for phase, value in window_phases(w).items():
                per_phase.setdefault(phase, {})[rank] = value
        for phase, values in per_phase.items():
            for o in window_outliers(values, typical, phase, loose):
                if o.value - o.reference >= 0.05 * typical:  # the share the rule demands
                    ratios.append(min(o.ratio, 1e3))
                    zs.append(o.z)
    if len(steps) and len(next(iter(steps))) > 1:
        out["straggler window, ratio (x, share >= 5%)"] = max(ratios)
        out["straggler window, robust z (share >= 5%)"] = max(zs)
        # the persistence test on the same runs, patience 1: the smallest binomial p any episode reached
        from telemetrain.analysis.findings.stragglers import stragglers

        eager = Thresholds(straggler_patience=1, straggler_alpha=0.999999)
        found, _ = stragglers(data.windows, (), eager)
        out["straggler episode, smallest binomial p"] = min(
            (1 - f.evidence.confidence for f in found if f.evidence and f.evidence.confidence is not None),
            default=1.0)
    steady = min((w.time_s for w in data.windows if not w.warmup), default=0.0)
    growth = [0.0]
    for s in data.memory:
        g = _growth(s, steady, loose)
        if g is not None:
            growth.append(g.growth / g.start if g.start else 0.0)
    out["memory growth after warm-up (fraction)"] = max(growth)
    spike_z, spike_ratio = [0.0], [1.0]
    real = Thresholds()
    for v in data.values:  # every point against the rule's running reference (its history: the non-spike points)
        history: list[float] = []
        for _, value in v.points:
            if not math.isfinite(value):
                continue
            if len(history) >= real.spike_min_history:
                recent = history[-real.spike_history:]
                center = statistics.median(recent)
                spread = max(1.4826 * statistics.median([abs(x - center) for x in recent]), 0.01 * abs(center))
                spike_z.append((value - center) / spread if spread else 0.0)
                spike_ratio.append(value / center if center > 0 else 1.0)
            history.append(value)
    out["loss/grad-norm point, robust z"] = max(spike_z)
    out["loss/grad-norm point, ratio to running median (x)"] = max(spike_ratio)
    contention = [p.contention for p in points if p.contention is not None]
    out["contention share, median"] = statistics.median(contention) if contention else math.nan
    return out


def calibrate(n: int, planted: bool = False) -> int:
    from _planted import SCENARIOS, run_scenario
    from telemetrain.analysis.samples import read_samples

    root = Path(tempfile.mkdtemp(prefix="calibrate-"))
    largest: dict[str, dict[str, list[float]]] = {}
    pairs: dict[str, list[tuple[float, float]]] = {}
    kinds = [("1 process", "clean"), ("4 ranks", "clean-4-ranks")]
    if planted:  # the planted slowdowns too: the margin on the other side of each floor
        kinds += [("1 process, slowdown planted", "mid-run-slowdown"),
                  ("4 ranks, slowdown planted", "slowdown-4-ranks")]
    for kind, scenario in kinds:
        runs = []
        for i in range(n):
            started = time.perf_counter()
            (run_dir,) = run_scenario(SCENARIOS[scenario], root / f"{scenario}-{i}")
            runs.append(run_dir)
            print(f"{kind} run {i + 1}: {time.perf_counter() - started:.0f} s, load {os.getloadavg()[0]:.1f}",
                  file=sys.stderr)
            for name, value in _largest(run_dir).items():
                largest.setdefault(kind, {}).setdefault(name, []).append(value)
        medians = []
        for run_dir in runs:
            s = read_samples(run_dir)
            medians.append((statistics.median(s.series("iteration_time")),
                            statistics.median(s.series("iteration_time", busy_free=True))))
        pairs[kind] = [(max(a[0], b[0]) / min(a[0], b[0]), max(a[1], b[1]) / min(a[1], b[1]))
                       for a, b in itertools.combinations(medians, 2)]
    print(f"Largest effect each rule saw in {n} run(s) of each kind, thresholds lowered to nothing "
          "(max; the per-run values in brackets):\n")
    print("| statistic | " + " | ".join(largest) + " |")
    print("|---|" + "---|" * len(largest))
    names = sorted({name for values in largest.values() for name in values})
    for name in names:
        cells = []
        for kind in largest:
            values = largest[kind].get(name)
            cells.append("-" if not values else f"{max(values):.3g} ({', '.join(f'{v:.3g}' for v in values)})")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\nBetween two clean runs of one kind, ratio of their median iteration times (max over pairs):\n")
    print("| runs | raw | contention taken out |")
    print("|---|---|---|")
    for kind, ratios in pairs.items():
        if ratios:
            print(f"| {kind} | {max(r for r, _ in ratios):.3f} | {max(b for _, b in ratios):.3f} |")
    return 0


def speed() -> int:
    """The engine's own CPU time on synthetic report windows (the shapes of the other benchmarks' runs)."""
    from telemetrain.analysis.findings import FindingsInput, analyse
    from test_findings_rules import windows

    print("| ranks x windows per rank | windows | planted | findings | CPU s (median of 3) |")
    print("|---|---|---|---|---|")
    for ranks, steps in ((8, 2000), (64, 500), (1024, 50)):
        ws = windows(ranks=ranks, steps=steps, every=50, seed=1, scale={k: 1.6 for k in range(steps // 2, steps)},
                     rank_phase={(3, "forward"): 0.005})
        data = FindingsInput(windows=ws)
        times = []
        for _ in range(3):
            started = time.process_time()
            result = analyse(data)
            times.append(time.process_time() - started)
        print(f"| {ranks} x {steps} | {len(ws)} | a slowdown, rank 3 forward | "
              f"{', '.join(f.title for f in result.findings)} | {statistics.median(times):.2f} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", type=int, metavar="N", help="run the planted-problem suite N times and score it")
    ap.add_argument("--calibrate", type=int, metavar="N", help="N clean runs of each kind: the noise, measured")
    ap.add_argument("--planted", action="store_true",
                    help="with --calibrate: also N runs of each planted slowdown (the margins on the other side)")
    ap.add_argument("--speed", action="store_true", help="the engine's CPU time on synthetic windows")
    args = ap.parse_args(argv)
    if args.speed:
        return speed()
    if args.suite:
        return suite(args.suite)
    if args.calibrate:
        return calibrate(args.calibrate, args.planted)
    ap.error("give --suite N or --calibrate N")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
