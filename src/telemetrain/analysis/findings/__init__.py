"""The findings engine: what went wrong in a run, each with its evidence, from plain series.

``analyse(FindingsInput(...))`` runs every rule (``slowdown``, ``stragglers``, ``checkpoints``, ``memory``,
``values``, ``crashes``) and returns ``Findings``: problems most severe first, and notes (a busy machine, live
events not confirmed).
``InputBuilder`` makes the input from typed records; ``run_findings(run)`` does both for a loaded run. The report,
``show``, ``tail`` and ``compare`` all use it; docs/report.md ("Findings") documents each rule.
"""

from .builder import InputBuilder, window_point
from .checkpoints import CheckpointSave
from .engine import analyse
from .inputs import (
    Attempt,
    ContainerMemory,
    FindingsInput,
    HostMemory,
    MemorySeries,
    NonFinite,
    SpanFailure,
    ValueSeries,
    WindowPoint,
)
from .model import Evidence, Finding, Findings, Note
from .run import run_findings
from .thresholds import DEFAULT_THRESHOLDS, Thresholds

__all__ = [
    "DEFAULT_THRESHOLDS",
    "Attempt",
    "CheckpointSave",
    "ContainerMemory",
    "Evidence",
    "Finding",
    "Findings",
    "FindingsInput",
    "HostMemory",
    "InputBuilder",
    "MemorySeries",
    "NonFinite",
    "Note",
    "SpanFailure",
    "Thresholds",
    "ValueSeries",
    "WindowPoint",
    "analyse",
    "run_findings",
    "window_point",
]
