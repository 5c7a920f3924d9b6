"""Collectives beyond the default group: sequence numbers per process group (``new_group``, DeviceMesh dimensions),
point-to-point pairs and ``batch_isend_irecv``, and the agent's view of a hang in a subgroup.

The gloo tests run 4 real ranks (torch.multiprocessing): two data-parallel pairs, each all-reducing on its pair only
(pair 0..1 twice a step, pair 2..3 once), and a global barrier.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from telemetrain.distributed.stall_view import classify

_PAIRS_WORKER = """
import json, os, sys, time, torch, torch.distributed as dist, torch.multiprocessing as mp, telemetrain
from torch.distributed.device_mesh import init_device_mesh
from telemetrain.distributed import collectives
from telemetrain.distributed.comm import comm_monitor
from telemetrain.distributed.evidence import collective_state

def wait_file(path):
    while not os.path.exists(path):
        time.sleep(0.01)

def main(rank, folder):
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=4)
    t = telemetrain.Telemetry(store=False)
    c, monitor = collectives.using(t), comm_monitor(t)
    pair = [dist.new_group([0, 1]), dist.new_group([2, 3])][rank // 2]
    x = torch.ones(4)
    for step in range(3):  # a clean job: pair 0..1 all-reduces twice a step, pair 2..3 once
        for _ in range(2 if rank < 2 else 1):
            c.all_reduce(x, group=pair)
        c.barrier()
    clean = collective_state(monitor, time.monotonic_ns())
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    c.all_reduce(x, group=mesh.get_group("tp"))
    tp = monitor.last_done
    peer = rank ^ 1  # point-to-point within the pair: a pipeline's send/recv, batched
    works = c.batch_isend_irecv([dist.P2POp(dist.isend, torch.ones(4), peer),
                                 dist.P2POp(dist.irecv, torch.empty(4), peer)])
    launched = [monitor._ops[-1].state]  # gloo's P2P works have no future: done when waited, not at the launch
    works[0].wait()
    works[0].is_completed()  # (asked again: still one work of two)
    launched.append(monitor._ops[-1].state)
    works[1].wait()
    batch = monitor.last_done
    w = c.isend(torch.ones(4), peer) if rank % 2 == 0 else c.irecv(torch.empty(4), peer)
    launched.append(monitor._ops[-1].state)
    assert isinstance(w, dist.Work) and w.wait()
    single = [monitor._ops[-1].kind, monitor._ops[-1].state, monitor._ops[-1].group_seq]
    # the hang: rank 1 stays out (in forward, say); rank 0 waits for it in the pair's all-reduce, ranks 2..3 in the
    # global barrier (their pair's all-reduce done)
    if rank == 1:
        for r in (0, 2, 3):
            wait_file(f"{folder}/ready{r}")
        hang = {"phase": "forward", **collective_state(monitor, time.monotonic_ns())}
    else:
        if rank >= 2:
            c.all_reduce(x, group=pair)
        work = c.all_reduce(x, group=pair, async_op=True) if rank == 0 else c.barrier(async_op=True)
        time.sleep(0.2)
        hang = {"phase": "backward", **collective_state(monitor, time.monotonic_ns())}
        open(f"{folder}/ready{rank}", "w").close()
    if rank == 1:
        c.all_reduce(x, group=pair)
        c.barrier()
    else:
        work.wait()
        if rank == 0:
            c.barrier()
    while monitor.open_ops():  # (an async_op work's completion callback runs in gloo's thread)
        time.sleep(0.01)
    out = {"clean": clean, "hang": hang, "tp": [tp.group, tp.group_ranks, tp.group_seq],
           "batch": [batch.kind, batch.nbytes, batch.state, batch.group, batch.group_seq],
           "launched": launched, "single": single,
           "states": sorted({o.state for o in monitor._ops})}
    with open(f"{folder}/rank{rank}.json", "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(main, args=(sys.argv[1],), nprocs=4)
"""


def _pairs_job(tmp_path: Path) -> dict[int, dict[str, Any]]:
    script = tmp_path / "pairs.py"
    script.write_text(_PAIRS_WORKER)
    subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=240,
                   check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)}


def test_subgroup_collectives_are_numbered_per_group_and_a_hang_in_a_pair_names_the_rank_that_stayed_out(
        tmp_path: Path) -> None:
    ranks = _pairs_job(tmp_path)
    # a clean job: each rank's last collective is the global barrier #3, the same number on every rank, though
    # pair 0..1 made 9 collectives and pair 2..3 made 6
    clean = [ranks[r]["clean"] for r in range(4)]
    assert {(c["last_completed_collective"], c["last_completed_seq"]) for c in clean} == {("barrier", 3)}
    assert [c["collectives_total"] for c in clean] == [9, 9, 6, 6]
    assert len({c["last_completed_group"] for c in clean}) == 1
    # a DeviceMesh dimension is a group too: its members agree on its name and its count
    tp = [ranks[r]["tp"] for r in range(4)]
    assert tp[0] == tp[1] and tp[2] == tp[3] and tp[0][0] != tp[2][0]
    assert (tp[0][1:], tp[2][1:]) == (["0..1", 1], ["2..3", 1])
    # batch_isend_irecv: one operation, both tensors' bytes, done when both works are, counted for the pair
    assert ranks[0]["batch"] == ranks[1]["batch"] == ["batch_isend_irecv", 32, "done", "p2p:0,1", 1]
    assert ranks[2]["batch"][3:] == ["p2p:2,3", 1]
    # gloo's point-to-point works have no future: open after the launch (they were 'done' at once, timed to the
    # launch), done when waited; the work returned is still a torch Work
    assert all(ranks[r]["launched"] == ["open", "open", "open"] for r in range(4))
    assert [ranks[r]["single"] for r in range(4)] == [["isend", "done", 2], ["irecv", "done", 2]] * 2
    assert all(ranks[r]["states"] == ["done"] for r in range(4))
    # the hang: compared per group, rank 1 is the one stuck (a count per process put rank 0 at #12, past the
    # barrier's #10 of ranks 2..3, and named ranks 2..3 as stuck)
    evidence = {r: {**ranks[r]["hang"], "step": 3} for r in range(4)}
    assert evidence[0]["collective_group_ranks"] == "0..1" and evidence[2]["collective_group_size"] == 4
    a = classify(evidence, 4)
    assert (a["ranks"], a["rank"], a["phase"], a["waiting_ranks"]) == ([1], 1, "forward", [0, 2, 3])
    assert a["waiting_in"] == "barrier #4 (other); all_reduce #7 (other) on ranks 0..1"
    assert a["message"] == ("stuck: rank 1 in forward while rank(s) 2..3 wait in barrier #4 (other); rank(s) 0 "
                            "wait in all_reduce #7 (other) on ranks 0..1")


def evidence(phase: str, seq: int | None = None, group: str = "0", ranks: str = "0..3", size: int = 4,
             kind: str = "all_reduce", nbytes: int = 16) -> dict[str, Any]:
    e: dict[str, Any] = {"phase": phase, "step": 7, "stalled_for_s": 70.0}
    if seq is not None:
        e.update(collective=kind, collective_seq=seq, collective_state="waiting", collective_phase=phase,
                 collective_group=group, collective_group_ranks=ranks, collective_group_size=size,
                 collective_bytes=nbytes)
    return e


def test_ranks_of_different_groups_are_compared_only_within_their_group() -> None:
    # two pairs each waiting in their own all-reduce (a network, not a rank): nobody is named, and counts of
    # different groups that differ are no mismatch
    a = classify({0: evidence("backward", 12, "1", "0..1", 2), 1: evidence("backward", 12, "1", "0..1", 2),
                  2: evidence("backward", 5, "2", "2..3", 2), 3: evidence("backward", 5, "2", "2..3", 2)}, 4)
    assert (a["ranks"], a["rank"], a["collective_mismatch"]) == ([], -1, [])
    assert a["waiting_ranks"] == [0, 1, 2, 3]
    # a skipped collective within one pair is still one: rank 3 is in a broadcast where rank 2 all-reduces, and
    # with no majority in a pair, nobody is named
    b = classify({0: evidence("backward", 12, "1", "0..1", 2), 1: evidence("backward", 12, "1", "0..1", 2),
                  2: evidence("backward", 5, "2", "2..3", 2),
                  3: evidence("backward", 5, "2", "2..3", 2, kind="broadcast")}, 4)
    assert b["ranks"] == [] and b["collective_mismatch"] == ["2:all_reduce #5 (16 B)", "3:broadcast #5 (16 B)"]
    assert b["message"].startswith("the ranks wait in collectives that differ at #5: rank 2 in all_reduce")
    # a send meets a recv: point-to-point sides are not a mismatch
    p = classify({0: evidence("forward", 3, "p2p:0,1", "0..1", 2, kind="send"),
                  1: evidence("forward", 3, "p2p:0,1", "0..1", 2, kind="recv")}, 2)
    assert p["collective_mismatch"] == [] and p["waiting_ranks"] == [0, 1]


def test_two_agents_of_a_c10d_job_name_the_late_rank_globally_and_their_own_nodes(tmp_path: Path) -> None:
    """Two `telemetrain launch` agents (two "nodes" of 2 ranks on this machine, one run store, a c10d rendezvous:
    torchrun's --node-rank stays 0 on both); rank 3, the second node's local rank 1, slow in forward."""
    import socket

    from telemetrain.store.reader import find_runs, open_run

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRAIN_", "TORCHELASTIC_", "TORCH_FR"))}
    env.update(TELEMETRAIN_DIR=str(tmp_path / "runs"), OMP_NUM_THREADS="1", STEPS="80", COMM="1", SLOW_RANK="3",
               SLOW_PHASE="forward", SLOW_S="0.04", TELEMETRAIN_CROSS_RANK="0", CROSS_TIMEOUT="60",
               CROSS_EVERY="10", MIN_SHARE="0.2")
    cmd = [sys.executable, "-m", "telemetrain.cli", "launch", "--nnodes", "2", "--nproc-per-node", "2",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", "twonodes",
           "--monitor-interval", "0.1", str(Path(__file__).with_name("_dist_worker.py"))]
    agents = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(2)]
    outs = [a.communicate(timeout=300) for a in agents]
    assert [a.returncode for a in agents] == [0, 0], [err[-2000:] for _, err in outs]
    (path,) = find_runs(tmp_path / "runs")
    run = open_run(path)
    assert sorted((p.rank, p.identity.local_rank) for p in run.processes) == [(0, 0), (1, 1), (2, 0), (3, 1)]
    # the late rank by its global rank, on both kinds, and no other rank
    found = [r.attributes for r in run.records("event") if r.group == "cross_rank" and r.name == "straggler"]
    assert {(a["rank"], a["phase"]) for a in found if a["kind"] == "late"} == {(3, "forward")}
    assert {a["rank"] for a in found} == {3}
    shown = subprocess.run([sys.executable, "-m", "telemetrain.cli", "show", str(path)], capture_output=True,
                           text=True, timeout=120, check=True, env=env).stdout
    assert "straggler: rank 3 (forward)" in shown and "straggler   rank 3" in shown
    # each agent is the node the rendezvous made it (the one of ranks 2..3 is node 1), not --node-rank's 0 twice
    (agents_line,) = [line for line in shown.splitlines() if line.startswith("agents ")]
    assert re.findall(r"node (\d+)", agents_line) and sorted(re.findall(r"node (\d+)", agents_line)) == ["0", "1"]
    from telemetrain.trace import build_trace

    names = [e["args"]["name"] for e in build_trace([open_run(path)])["traceEvents"] if e["name"] == "process_name"]
    assert sorted(re.findall(r"agent of node (\d+)", " ".join(names))) == ["0", "1"]  # and the trace's


def _launch4(tmp_path: Path, **env: Any) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRAIN_", "TORCHELASTIC_", "TORCH_FR"))}
    full.update({"TELEMETRAIN_DIR": str(tmp_path / "runs"), "OMP_NUM_THREADS": "1", "PAIRS": "1", "COMM": "1"})
    full.update({k: str(v) for k, v in env.items()})
    cmd = [sys.executable, "-m", "telemetrain.cli", "launch", "--nproc-per-node", "4", "--monitor-interval", "0.1",
           str(Path(__file__).with_name("_dist_worker.py"))]
    return subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=300, check=False)


def test_a_rank_blocked_in_a_pair_is_the_one_the_agent_names_and_a_clean_pairs_job_has_no_finding(
        tmp_path: Path) -> None:
    """The real launcher, watchdog and agent: 4 ranks in DDP pairs, ranks 0..1 with one more all-reduce a step,
    a global barrier."""
    from telemetrain.report.model import build_model
    from telemetrain.store.reader import find_runs, open_run

    clean = _launch4(tmp_path / "clean", STEPS=60, TELEMETRAIN_WATCHDOG="floor=5,startup=60")
    assert clean.returncode == 0, clean.stderr[-3000:]
    (path,) = find_runs(tmp_path / "clean" / "runs")
    run = open_run(path)
    named = [r.name for r in run.records("event", agents=True) if r.name in ("stall", "stall_evidence", "straggler")]
    assert named == [] and [f.title for f in build_model(run).findings if "stall" in f.title] == []
    # rank 1 blocks in forward at step 30: rank 0 waits in the pair's all-reduce, ranks 2..3 in the barrier
    hung = _launch4(tmp_path / "hung", STEPS=400, BLOCK_RANK=1, BLOCK_AT=30, PG_TIMEOUT=8,
                    TELEMETRAIN_WATCHDOG="floor=2,k=3,startup=30,poll=0.2")
    assert hung.returncode == 1
    (path,) = find_runs(tmp_path / "hung" / "runs")
    run = open_run(path)
    (stall,) = [r.attributes for r in run.records("event", agents=True) if r.name == "stall"]
    assert (stall["ranks"], stall["phase"], stall["waiting_ranks"]) == ([1], "forward", [0, 2, 3])
    # (a count per process put rank 0 at #91, past the barrier's #62 of ranks 2..3, and named them stuck)
    assert stall["waiting_in"] == "barrier #31 (optimizer); all_reduce #61 (backward) on ranks 0..1"
