"""The ``telemetrain launch`` command: torchrun with the agent's telemetry (``distributed.launch``)."""

from __future__ import annotations

from typing import Any

__all__ = ["register", "run_launch"]

USAGE = "telemetrain launch [torchrun options] TRAINING_SCRIPT [SCRIPT ARGS...]"


def run_launch(argv: list[str]) -> int:
    import importlib.util

    from ..cli_common import CLIError

    if importlib.util.find_spec("torch") is None:
        raise CLIError("`telemetrain launch` needs PyTorch, which is not installed: pip install torch==2.13.0")
    from .launch import main

    return main(argv)


def register(sub: Any) -> None:
    """``launch`` takes torchrun's own flags, which torchrun's parser reads: ``cli.main`` hands it every argument
    after ``launch`` untouched, before this parser sees them. This entry only lists it in ``telemetrain --help``."""
    sub.add_parser(
        "launch",
        help="torchrun, with the elastic agent's metrics and events in the job's run store",
        usage=USAGE,
        add_help=False,
        description="Run torchrun (same flags) and record the elastic agent's telemetry beside the workers'. "
        "`telemetrain launch --help` lists torchrun's flags.",
    )
