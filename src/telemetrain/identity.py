"""Run identity: who produced a record.

Read once per process from the torchrun/torchelastic environment (or the ``TELEMETRAIN_*`` overrides), overridable
in code, and replaced in a forked child so the child's records carry the child's pid.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

__all__ = ["Identity", "check_path_name", "fit_name", "identity_from_env", "identity_of", "new_run_id", "token_for"]


@dataclasses.dataclass(frozen=True, slots=True)
class Identity:
    """Where a record came from. Shared by reference by every record of one process."""

    run_id: str
    session_tag: str
    perf_tag: str
    rank: int
    local_rank: int
    world_size: int
    host: str
    pid: int
    group_rank: int = 0
    restart_count: int = 0
    role: str = ""

    def __post_init__(self) -> None:
        for name in ("run_id", "session_tag", "perf_tag"):
            check_path_name(getattr(self, name), f"Identity.{name}")
        for name in ("rank", "local_rank", "world_size", "pid", "group_rank", "restart_count"):
            value = getattr(self, name)
            if type(value) is not int:
                raise TypeError(f"Identity.{name} must be an int, got {type(value).__name__}")
        if self.world_size < 1:
            raise ValueError(f"Identity.world_size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"Identity.rank must be in [0, world_size={self.world_size}), got {self.rank}")

    def replace(self, **changes: Any) -> Identity:
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Identity:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})


MAX_NAME_BYTES = 128  # a run id, session or perf tag (a directory name: 255 bytes on most filesystems, 143 on some)


def check_path_name(value: Any, arg: str) -> str:
    """A name that becomes a directory name: a non-empty str, no path separator (``/``, ``\\``), no NUL, not ``.``
    or ``..``, at most ``MAX_NAME_BYTES`` bytes of UTF-8. ``TypeError``/``ValueError`` naming ``arg``."""
    if not isinstance(value, str):
        raise TypeError(f"{arg} must be a str, got {type(value).__name__}")
    if not value or value in (".", ".."):
        raise ValueError(f"{arg} must be a non-empty name, not {value!r}")
    bad = next((c for c in ("/", "\\", "\0") if c in value), None)
    if bad is not None:
        raise ValueError(f"{arg} becomes a directory name and must not contain {bad!r}, got {value!r:.200}")
    try:
        size = len(value.encode())
    except UnicodeEncodeError:  # a lone surrogate: no file system takes it
        raise ValueError(f"{arg} is not valid text (a lone surrogate?): {value!r:.200}") from None
    if size > MAX_NAME_BYTES:
        raise ValueError(f"{arg} is {size} bytes long; a name that becomes a directory name is at most "
                         f"{MAX_NAME_BYTES} bytes (UTF-8), got {value[:40]!r}...")
    return value


def fit_name(value: str) -> str:
    """A name from the environment made to fit ``MAX_NAME_BYTES``: kept if it does; else its beginning and a hash
    of the whole (``<prefix>-<16 hex digits>``): the same on every rank, and still unique."""
    data = value.encode()
    if len(data) <= MAX_NAME_BYTES:
        return value
    digest = hashlib.sha256(data).hexdigest()[:16]
    prefix = data[: MAX_NAME_BYTES - len(digest) - 1].decode("utf-8", "ignore").rstrip(".")
    return f"{prefix}-{digest}"


# -- identity tokens ---------------------------------------------------------------------------------------------------
# Packed records carry an int token for their identity (see records). Tokens are process-wide and never reused, so a
# token issued by any Telemetry resolves in any sink: a record that races a set_telemetry() or set_identity() keeps
# the identity it was built with, whichever queue it lands in.

_tokens: dict[int, Identity] = {}
_token_of: dict[Identity, int] = {}
_tokens_lock = threading.Lock()


def token_for(identity: Identity) -> int:
    """The token of an identity (equal identities share one)."""
    token = _token_of.get(identity)
    if token is not None:
        return token
    with _tokens_lock:
        token = _token_of.get(identity)
        if token is None:
            token = len(_tokens) + 1
            _tokens[token] = identity
            _token_of[identity] = token
        return token


def identity_of(token: int) -> Identity:
    """The identity a token stands for (``KeyError`` for a token never issued in this process)."""
    return _tokens[token]


def _after_fork_in_child() -> None:
    global _tokens_lock
    _tokens_lock = threading.Lock()  # a fork while another thread held it must not leave the child stuck


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def new_run_id() -> str:
    """A sortable, unique run id: UTC start time plus 24 random bits."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


def _int_env(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from None


def _entry_name() -> str:
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c", "-m") else ""
    stem = os.path.splitext(os.path.basename(argv0))[0]
    return stem or "python"


def _safe_name(value: str) -> str:
    """A name from the environment made safe as a directory name: odd characters become ``_``, a long one is
    shortened with a hash (``fit_name``)."""
    cleaned = "".join(c if c.isalnum() or c in "-_.+=@" else "_" for c in value).strip(".")
    return fit_name(cleaned or "run")


def _first_int(env: Mapping[str, str], names: tuple[str, ...], default: int) -> int:
    """The first of ``names`` that is set, as an int (torchrun's variable first, then SLURM's, then MPI's)."""
    for name in names:
        if env.get(name, "") != "":
            return _int_env(env, name, default)
    return default


def identity_from_env(env: Mapping[str, str] | None = None, **overrides: Any) -> Identity:
    """Build the identity of this process.

    Precedence: keyword overrides > ``TELEMETRAIN_*`` variables > torchrun/torchelastic variables > SLURM and MPI
    variables (for jobs started by ``srun`` or ``mpirun`` without torchrun) > defaults.

    - ``session_tag`` (one job, across its restarts): ``TELEMETRAIN_SESSION_TAG``, else torchelastic's job id
      ``TORCHELASTIC_RUN_ID`` (unless it is torchrun's placeholder ``"none"``), else ``slurm-<SLURM_JOB_ID>``, else
      the run id (a session of one run).
    - ``run_id`` (one attempt of the session; a restart gets a new one), chosen so that every rank of an attempt
      agrees without talking: ``TELEMETRAIN_RUN_ID``, else ``<TORCHELASTIC_RUN_ID>.<restart count>`` under
      torchelastic, else ``slurm-<job id>[.<step id>].<SLURM_RESTART_COUNT>`` under SLURM, else a fresh sortable id
      (a single process, or ranks started otherwise: set ``TELEMETRAIN_RUN_ID`` for them).
    - ``perf_tag`` (runs that should perform alike): ``TELEMETRAIN_PERF_TAG``, else the entry script's name.
    - ``rank``/``local_rank``/``world_size``: ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``, else ``SLURM_PROCID``/
      ``SLURM_LOCALID``/``SLURM_NTASKS``, else Open MPI's ``OMPI_COMM_WORLD_*``, else 0/0/1.
    """
    env = os.environ if env is None else env
    elastic_id = env.get("TORCHELASTIC_RUN_ID", "")
    # under torchelastic its own count of restarts, else SLURM's (a requeued job)
    elastic = bool(elastic_id) or "TORCHELASTIC_RESTART_COUNT" in env
    restart_count = _int_env(env, "TORCHELASTIC_RESTART_COUNT" if elastic else "SLURM_RESTART_COUNT", 0)
    if elastic_id == "none":
        # torchrun's placeholder: ranks of one node still agree through their common parent, the agent.
        elastic_id = f"none-{os.getppid()}"
    slurm_job = env.get("SLURM_JOB_ID", "")
    slurm_run = ""
    if slurm_job:
        step = env.get("SLURM_STEP_ID", "")
        slurm_run = f"slurm-{slurm_job}" + (f".{step}" if step else "") + f".{restart_count}"
    run_id = (
        env.get("TELEMETRAIN_RUN_ID")
        or (f"{elastic_id}.{restart_count}" if elastic_id else "")
        or slurm_run
        or new_run_id()
    )
    session_tag = (
        env.get("TELEMETRAIN_SESSION_TAG")
        or (elastic_id if elastic_id else "")
        or (f"slurm-{slurm_job}" if slurm_job else "")
        or run_id
    )
    values: dict[str, Any] = {
        "run_id": _safe_name(run_id),
        "session_tag": _safe_name(session_tag),
        "perf_tag": _safe_name(env.get("TELEMETRAIN_PERF_TAG") or _entry_name()),
        "rank": _first_int(env, ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"), 0),
        "local_rank": _first_int(env, ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"), 0),
        "world_size": _first_int(env, ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"), 1),
        "group_rank": _first_int(env, ("GROUP_RANK", "SLURM_NODEID"), 0),
        "restart_count": restart_count,
        "role": env.get("ROLE_NAME", ""),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    values.update(overrides)
    return Identity(**values)
