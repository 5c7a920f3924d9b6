"""A small training job that runs out of its container's memory, for ``tests/test_system_container.py``.

It records its lifecycle with a ``TrainingRecorder`` and samples the system every 20 ms. ``MODE``:

- ``real``: joins the real cgroup ``CGROUP_DIR`` (v1 memory hierarchy: its pid written to ``cgroup.procs``) and
  keeps allocating until the kernel's OOM killer kills it; slowly once the cgroup's usage passes 90% of its limit,
  so that samples near the limit reach the run store before the kill;
- ``worker``: joins it too, and starts a worker process that allocates until the OOM killer kills it (its
  ``oom_score_adj`` at 1000: the killer's first choice), then ends normally;
- ``planted``: reads the planted cgroup tree ``CGROUP_ROOT`` (its ``/proc/self/cgroup`` is ``SELF_CGROUP``), whose
  usage file it sets to ``USAGE`` bytes (``INACTIVE`` of them inactive file cache) before the sampler starts, and
  then SIGKILLs itself (``END=kill``) or ends normally (``END=ok``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from telemetrain import get_telemetry
from telemetrain.system import cgroup_memory, start_sampler
from telemetrain.training import TrainingRecorder, TrainingTelemetryConfig

# the worker: first in line for the OOM killer (its own choice: raising oom_score_adj needs no privilege), then
# allocating until killed
WORKER = """
open('/proc/self/oom_score_adj', 'w').write('1000')
held = []
while True:
    held.append(b'\\x01' * (1 << 20))
"""


def main() -> None:
    mode = os.environ["MODE"]
    if mode in ("real", "worker"):
        directory = os.environ["CGROUP_DIR"]
        with open(os.path.join(directory, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    else:
        cgroup_memory.CGROUP_ROOT = os.environ["CGROUP_ROOT"]
        cgroup_memory.SELF_CGROUP = os.environ["SELF_CGROUP"]
        with open(os.path.join(os.environ["CGROUP_DIR"], "memory.current"), "w") as f:
            f.write(os.environ["USAGE"] + "\n")
        with open(os.path.join(os.environ["CGROUP_DIR"], "memory.stat"), "w") as f:
            f.write(f"anon 1000\nfile 2000\ninactive_file {os.environ.get('INACTIVE', '0')}\n")
    telemetry = get_telemetry()
    start_sampler(telemetry, interval=0.02, cuda_allocator=False, gpus=[])
    rec = TrainingRecorder(TrainingTelemetryConfig(
        global_batch_size_or_fn=1, perf_tag_or_fn="oom", log_every_n_train_iterations=1,
        train_iterations_target_or_fn=10**6, world_size_or_fn=1, is_baseline_run_or_fn=False), telemetry=telemetry)
    rec.on_app_start()
    rec.on_train_start(train_iterations_start=0)
    held: list[bytes] = []
    if mode == "worker":  # a worker of the job's (a DataLoader worker, say) is the one the OOM killer picks
        worker = subprocess.Popen([sys.executable, "-c", WORKER])
        for _ in range(10**6):
            rec.on_training_single_iteration_start()
            time.sleep(0.01)
            rec.on_training_single_iteration_end()
            if worker.poll() is not None:
                break
        assert worker.returncode == -signal.SIGKILL, worker.returncode
        time.sleep(0.2)  # samples after the kill
        rec.on_train_end()
        rec.on_app_end()
        return
    if mode == "real":
        limit = int(open(os.path.join(directory, "memory.limit_in_bytes")).read())
        for _ in range(10**6):
            rec.on_training_single_iteration_start()
            held.append(b"\x01" * (1 << 20))  # touched pages: charged to the cgroup
            rec.on_training_single_iteration_end()
            usage = int(open(os.path.join(directory, "memory.usage_in_bytes")).read())
            time.sleep(0.1 if usage > 0.9 * limit else 0.005)
        raise SystemExit("not killed")
    for _ in range(5):
        rec.on_training_single_iteration_start()
        time.sleep(0.03)
        rec.on_training_single_iteration_end()
    telemetry.flush()
    if os.environ["END"] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    rec.on_train_end()
    rec.on_app_end()


if __name__ == "__main__":
    main()
