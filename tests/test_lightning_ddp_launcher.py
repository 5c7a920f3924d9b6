"""Lightning's own DDP launcher (``strategy="ddp"``, ``devices=2`` under a plain ``python train.py``): one run with
ranks 0 and 1 and world size 2, not two runs of a rank 0 each. Real processes, real gloo, the real run store."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("lightning.pytorch")

from telemetrain.cli import main
from telemetrain.report.model import build_model
from telemetrain.store import open_run
from telemetrain.store.reader import find_runs

STEPS = 3

SCRIPT = textwrap.dedent(f"""
    import sys

    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.loggers import CSVLogger
    from torch.utils.data import DataLoader, TensorDataset

    from telemetrain.integrations.lightning import TelemetrainCallback
    from telemetrain.integrations.lightning_logger import TelemetrainLogger


    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def prepare_data(self):  # on local rank 0 only, once the process group is up
            if "--second-logger" in sys.argv:
                self.trainer.loggers[-1].log_metrics({{"prepared": 1.0}}, step=0)


    if __name__ == "__main__":
        callbacks = [] if "--logger-only" in sys.argv else [TelemetrainCallback()]
        loggers = [TelemetrainLogger()]
        if "--second-logger" in sys.argv:  # not the first logger: Lightning's first use of it is setup's experiment
            loggers.insert(0, CSVLogger("csv"))
        torch.manual_seed(0)
        data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        trainer = pl.Trainer(strategy="ddp", devices=2, accelerator="cpu", max_steps={STEPS}, log_every_n_steps=1,
                             logger=loggers, callbacks=callbacks,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(Tiny(), DataLoader(data, batch_size=8))
""")


@pytest.mark.parametrize(("launcher", "flags"), [("lightning", ()), ("torchrun", ()), ("lightning", ("--logger-only",)),
                                            ("lightning", ("--logger-only", "--second-logger"))])
def test_lightnings_own_ddp_launcher_writes_one_run_with_both_ranks(launcher: str, flags: tuple[str, ...],
                                                                    tmp_path: Path) -> None:
    """Lightning's launcher: the ranks agree at the callback's setup, or at the Trainer's first use of the logger
    when it is alone (as the first logger, or a later one used by rank 0's prepare_data before that). torchrun: the
    identity its environment gives is kept."""
    callback = "--logger-only" not in flags
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    launched = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS",
                "OMPI_COMM_WORLD_RANK", "TELEMETRAIN_RUN_ID", "TELEMETRAIN_SESSION_TAG")
    env = {k: v for k, v in os.environ.items() if k not in launched}
    env.update(TELEMETRAIN_DIR=str(tmp_path / "store"), OMP_NUM_THREADS="1", PL_DISABLE_FORK="1")
    command = [sys.executable, str(script), *flags]
    if launcher == "torchrun":
        command[1:1] = ["-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d",
                        "--rdzv-endpoint=localhost:0", "--rdzv-id=ddp-test"]
    proc = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]

    (run_dir,) = find_runs(tmp_path / "store")  # one run, not one per process
    run = open_run(run_dir)
    if launcher == "torchrun":
        assert (run.run_id, run.session_tag) == ("ddp-test.0", "ddp-test")  # torchrun's, as before
    assert run.ranks == [0, 1]
    identities = {(p.identity.rank, p.identity.local_rank, p.identity.world_size) for p in run.processes}
    assert identities == {(0, 0, 2), (1, 1, 2)}
    ends = [r for r in run.records("span_end") if r.name == "training_single_iteration"]
    assert sorted(r.identity.rank for r in ends) == ([0] * STEPS + [1] * STEPS if callback else [])
    losses = [r for r in run.records("metric") if r.name == "loss"]
    assert sorted((r.identity.rank, r.step) for r in losses) == [(rank, s) for rank in (0, 1) for s in range(STEPS)]
    assert build_model(run).findings == []  # a clean run: no finding (a missing rank would be one)
    assert main(["report", str(run_dir), "-o", str(tmp_path / "report.html")]) == 0



OUTSIDE = textwrap.dedent("""
    import sys
    import warnings
    from datetime import timedelta

    import torch.distributed as dist

    from telemetrain import Telemetry
    from telemetrain.integrations.lightning_logger import TelemetrainLogger

    rank, init, store = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=timedelta(seconds=20))
    t = Telemetry(store=store)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a failed adoption would only warn
        if rank == 0:  # user code on one rank, outside any Trainer (Fabric, a rank-zero-only call)
            TelemetrainLogger(telemetry=t).log_metrics({"x": 1.0}, step=0)
    dist.barrier()  # the other rank's next collective: a broadcast above would have been paired with it
    print(t.identity.rank, t.identity.world_size)
    t.close()
    dist.destroy_process_group()
""")


def test_a_first_use_outside_the_trainer_makes_no_collective(tmp_path: Path) -> None:
    """The logger agrees on the run only when the Trainer is the caller: a use on one rank alone, once a process
    group is up, must not start a collective the other ranks never join."""
    script = tmp_path / "outside.py"
    script.write_text(OUTSIDE)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")}
    env.update(OMP_NUM_THREADS="1")
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [subprocess.Popen([sys.executable, str(script), str(rank), init, str(tmp_path / "store")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outputs]
    assert [out.split() for out, _ in outputs] == [["0", "1"], ["0", "1"]]  # each kept the identity it had


def test_ddp_spawn_takes_a_logger_already_used_and_writes_one_run(tmp_path: Path) -> None:
    """ddp_spawn pickles the loggers to its processes: a logger whose default Telemetry was already made (its
    version read before fit) leaves it behind, and the spawned ranks share one run."""
    script = tmp_path / "spawn.py"
    text = SCRIPT.replace('strategy="ddp"', 'strategy="ddp_spawn"').replace(
        "    loggers = [TelemetrainLogger()]\n",
        "    loggers = [TelemetrainLogger()]\n    print(loggers[0].version)  # the default Telemetry, made\n")
    assert "ddp_spawn" in text and "print(loggers[0].version)" in text
    script.write_text(text)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_PROCID",
                                                             "OMPI_COMM_WORLD_RANK", "TELEMETRAIN_RUN_ID")}
    env.update(TELEMETRAIN_DIR=str(tmp_path / "store"), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(script), "--logger-only"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = find_runs(tmp_path / "store")
    spawned = [open_run(r) for r in runs if open_run(r).records("metric")]
    (run,) = spawned  # the parent's own default Telemetry recorded nothing
    assert run.ranks == [0, 1]
    losses = [r for r in run.records("metric") if r.name == "loss"]
    assert sorted((r.identity.rank, r.step) for r in losses) == [(rank, s) for rank in (0, 1) for s in range(STEPS)]
