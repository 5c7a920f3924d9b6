"""How long ``telemetrain compare`` takes on long multi-rank runs: loading the windows, and the bootstrap.

Two runs of ``--ranks`` ranks x ``--iterations`` iterations are written by real ``Telemetry`` + ``TrainingRecorder``
instances (one per rank, in this process, one after another; every iteration with its four sub-phase spans;
``log_every_n_train_iterations`` 50, so iteration spans are exported one in 50). Then, each timed with
``time.perf_counter`` over ``--repeats`` repeats (median and best reported): reading both runs' windows
(``run_samples``), the comparison (``compare_runs`` on the loaded windows: run, phases and ranks, 2000 resamples), and
the whole command (``telemetrain compare --json``, in this process).

    python bench/bench_compare.py            # 8 ranks x 100k iterations (about a minute to write the runs)
    python bench/bench_compare.py --quick    # 2 ranks x 10k
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any


def write_run(root: Path, run_id: str, ranks: int, iterations: int) -> Path:
    from telemetrain import Telemetry, identity_from_env
    from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

    for rank in range(ranks):
        identity = identity_from_env({}, run_id=run_id, session_tag="bench", perf_tag="bench-compare", rank=rank,
                                     local_rank=rank, world_size=ranks)
        t = Telemetry(identity, store=root)
        r = TrainingRecorder(TrainingTelemetryConfig(global_batch_size_or_fn=256, log_every_n_train_iterations=50),
                             telemetry=t)
        r.on_app_start()
        r.on_train_start(0)
        for _ in range(iterations):
            r.on_training_single_iteration_start()
            with r.data_loading():
                pass
            with r.forward():
                pass
            with r.backward():
                pass
            with r.optimizer_update():
                pass
            r.on_training_single_iteration_end()
        r.on_train_end()
        r.on_app_end()
        t.close()
    return root / "bench" / run_id


def timed(fn: Callable[[], Any], repeats: int) -> tuple[list[float], Any]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return times, result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 ranks x 10k iterations, 2 repeats")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--iterations", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", metavar="FILE", help="also write the results to FILE")
    args = ap.parse_args(argv)
    if args.quick:
        args.ranks, args.iterations, args.repeats = 2, 10_000, 2

    from telemetrain import cli
    from telemetrain.analysis import compare_runs, run_samples

    with tempfile.TemporaryDirectory(prefix="bench-compare-") as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        base = write_run(root, "baseline", args.ranks, args.iterations)
        cand = write_run(root, "candidate", args.ranks, args.iterations)
        written = time.perf_counter() - start
        size = sum(f.stat().st_size for d in (base, cand) for f in d.iterdir())
        print(f"wrote 2 runs of {args.ranks} ranks x {args.iterations} iterations ({size / 2**20:.1f} MiB) in "
              f"{written:.1f} s", file=sys.stderr)

        load_times, loaded = timed(lambda: (run_samples(cand), run_samples(base)), args.repeats)
        compare_times, comparison = timed(lambda: compare_runs(loaded[0], loaded[1]), args.repeats)

        def command() -> int:
            with redirect_stdout(io.StringIO()):
                return cli.main(["compare", str(cand), "--baseline", str(base), "--json"])

        command_times, code = timed(command, args.repeats)
        assert code == 0
        windows = loaded[0].window_count + loaded[1].window_count
        metrics = len(comparison.candidates[0].metrics)

    rows = [("load both runs (run_samples x2)", load_times), (f"compare_runs ({metrics} metrics)", compare_times),
            ("telemetrain compare --json", command_times)]
    print(f"bench_compare: 2 runs x {args.ranks} ranks x {args.iterations} iterations, {size / 2**20:.1f} MiB, "
          f"{windows} windows, {args.repeats} repeats")
    print(f"{'step':<34} {'median s':>9} {'best s':>9}")
    for name, times in rows:
        print(f"{name:<34} {statistics.median(times):>9.3f} {min(times):>9.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "ranks": args.ranks, "iterations": args.iterations, "bytes": size, "windows": windows,
            "results": [{"step": name, "median_s": statistics.median(t), "best_s": min(t), "times_s": t}
                        for name, t in rows]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
