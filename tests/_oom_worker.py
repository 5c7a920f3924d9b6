"""A launched worker that dies of SIGKILL, for ``tests/test_launch_oom.py``: ``END=oom`` allocates until the OOM
killer of its cgroup kills it (its ``oom_score_adj`` at 1000: the killer's first choice, not the agent);
``END=kill`` SIGKILLs itself, with no memory pressure. No torch: the worker stays small until it allocates."""

from __future__ import annotations

import os
import signal

if os.environ["END"] == "oom":
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
    held = []
    while True:
        held.append(b"\x01" * (1 << 20))  # touched pages: charged to the cgroup
os.kill(os.getpid(), signal.SIGKILL)
