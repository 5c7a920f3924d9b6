"""Where a run lives on disk (format v1, see docs/format.md)::

<root>/<session_tag>/<run_id>/run.json
<root>/<session_tag>/<run_id>/rank-<R>.<pid>.jsonl
<root>/<session_tag>/<run_id>/agent-<node>.<pid>.jsonl     the launcher's elastic agent (``telemetrain launch``)
"""

from __future__ import annotations

import os
from pathlib import Path

from ..identity import Identity

FORMAT_VERSION = 1
RUN_META = "run.json"
DEFAULT_ROOT = "telemetrain-runs"


def default_root() -> Path:
    """``$TELEMETRAIN_DIR``, else ``./telemetrain-runs``."""
    return Path(os.environ.get("TELEMETRAIN_DIR") or DEFAULT_ROOT)


def run_dir(root: str | os.PathLike[str], identity: Identity) -> Path:
    return Path(root) / identity.session_tag / identity.run_id


AGENT_ROLE = "agent"  # the identity role of the launcher's agent process; its rank is its node's rank


def process_file_name(identity: Identity) -> str:
    if identity.role == AGENT_ROLE:
        return f"agent-{identity.group_rank}.{identity.pid}.jsonl"
    return f"rank-{identity.rank}.{identity.pid}.jsonl"


def is_process_file(name: str) -> bool:
    """A worker's file or an agent's."""
    return name.endswith(".jsonl") and (name.startswith("rank-") or name.startswith("agent-"))


def is_agent_file(name: str) -> bool:
    return name.startswith("agent-") and name.endswith(".jsonl")
