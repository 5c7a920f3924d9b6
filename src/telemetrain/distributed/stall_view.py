"""The launcher agent's view of a stall: every rank's evidence, and one ``stall`` event naming the ranks stuck
elsewhere than the others.

``StallWatcher`` runs in the agent of ``telemetrain launch`` (its own daemon thread). It follows the workers' files of
the current attempt's run folder (the agent's node; every node with a shared run store, where the agent on the
lowest rank's host speaks) and keeps each rank's first
``stall_evidence`` of reason ``stall`` (evidence written because a collective failed, or at a SIGTERM, stays in the
ranks' files: that is a failure, not a stall). Once a rank reported, it waits until every rank did (or
``gather_s``), then ``classify`` decides and the agent writes one ``stall`` event (group ``launcher``, severity
error) per attempt:

- ranks waiting in a collective: per process group (sequence numbers count per group: a subgroup's collectives
  advance only its members'), those in its collective with the highest sequence number are *waiting*; every
  other rank that reported is *stuck* -- it never got to that collective (a rank blocked in data loading while the
  rest wait in the all-reduce) -- and so is a rank at that number in another collective (kind or bytes) than most:
  it skipped one or called one more (``collective_mismatch``; with no majority, nobody is named);
- no rank in a collective: the ranks outside the largest group of ranks in the same phase are stuck;
- all ranks that reported in one place (the same collective, or the same phase): the ranks that gave no evidence
  (``silent_ranks``: dead, hung without a watchdog) are the ones named; with none, nobody is, and the event says
  where all of them are (a network, or a peer outside the job).

Attributes: ``ranks`` (stuck), ``rank``/``phase``/``host`` (the first stuck rank's), ``phases`` (``"<rank>:<phase>"``
per stuck rank), ``waiting_ranks``, ``waiting_in`` (``"all_reduce #31 (backward)"``; per group, ``; ``-separated,
a subgroup's with ``on ranks 0..1``), ``silent_ranks``,
``evidence_ranks``, ``step``, ``stalled_for_s``, ``message``.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from ..analysis.findings.fmt import ranges
from ..dispatch import describe, warn_safely
from ..store.codec import untag_nonfinite
from ..store.layout import MAX_LINE_BYTES, is_agent_file, is_process_file
from ..telemetry import Telemetry
from .groups import P2P_KINDS

__all__ = ["StallWatcher", "classify"]

EVIDENCE = "stall_evidence"
GROUP = "launcher"
_MARK = b'"stall_evidence"'
READ_LIMIT = 64 << 20  # bytes read per file per poll (a far-behind follower catches up over several polls)


class _EvidenceFollower:
    """A growing worker file: the ``stall_evidence`` records appended since the last poll. Only chunks that contain
    the name are split into lines and only those lines decoded, so following a busy run costs the agent a
    substring search per chunk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.pending = b""
        self.skipping = False  # inside a line longer than the format's cap, dropped up to its newline
        self.rank: int | None = None
        self.host: str | None = None  # from the header (None: no header)
        self.world_size: int | None = None

    def poll(self) -> list[tuple[int, dict[str, Any]]]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(READ_LIMIT)
        except OSError:
            return []
        self.offset += len(data)
        data = self.pending + data
        cut = data.rfind(b"\n")
        if self.skipping and cut >= 0:  # the end of a line past the cap, its start dropped already
            data, cut, self.skipping = data[data.index(b"\n") + 1:], cut - data.index(b"\n") - 1, False
        if cut < 0:
            self.pending = data
            if len(data) > MAX_LINE_BYTES:  # a line no reader reads (the format's cap): not held until it ends
                self.pending, self.skipping = b"", True
            return []
        complete, self.pending = data[:cut], data[cut + 1:]
        if len(self.pending) > MAX_LINE_BYTES:
            self.pending, self.skipping = b"", True
        if self.rank is None:
            self.rank = self._rank_of(complete.split(b"\n", 1)[0])
        if _MARK not in complete or self.rank is None:
            return []
        out = []
        for line in complete.split(b"\n"):
            if _MARK not in line:
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and obj.get("kind") == "event" and obj.get("name") == EVIDENCE and \
                    obj.get("group") == "watchdog" and isinstance(obj.get("attributes"), dict):
                out.append((self.rank, untag_nonfinite(obj["attributes"])))
        return out

    def _rank_of(self, header: bytes) -> int | None:
        try:
            identity = json.loads(header)["identity"]
            rank, host, world = identity["rank"], identity.get("host"), identity.get("world_size")
            self.host = host if isinstance(host, str) else None
            self.world_size = world if isinstance(world, int) and world > 0 else None
            return rank if isinstance(rank, int) else None
        except (ValueError, KeyError, TypeError):  # no header line: the file name says it (rank-<R>.<pid>.jsonl)
            name = self.path.name.removeprefix("rank-").split(".", 1)[0]
            return int(name) if name.isdigit() else None


def _rank_list(ranks: list[int]) -> str:
    return ranges(ranks) or "none"  # (``0..1022``: a hang of a thousand ranks is one line)


def _signature(e: Mapping[str, Any]) -> tuple[str, Any]:
    """What must match between the members of a collective: its kind and bytes (a send meets a recv)."""
    kind = str(e.get("collective"))
    return ("p2p", None) if kind in P2P_KINDS else (kind, e.get("collective_bytes"))


def _at_top(in_collective: Mapping[int, Mapping[str, Any]], members: list[int]
            ) -> tuple[int, list[int], list[int], list[str]]:
    """One group's ranks in a collective: its top sequence number, the ranks at it, those among them in another
    collective than most (a rank skipped one, or called one more: the collectives never match, and gloo and NCCL
    wait out their timeout), and what each of those waits in (all of them when no majority says which is off)."""
    top = max(in_collective[r]["collective_seq"] for r in members)
    at_top = sorted(r for r in members if in_collective[r]["collective_seq"] == top)
    sig = {r: _signature(in_collective[r]) for r in at_top}
    groups = Counter(sig.values()).most_common()
    off: list[int] = []
    said: list[str] = []
    if len(groups) > 1:
        if groups[1][1] < groups[0][1]:
            off = [r for r in at_top if sig[r] != groups[0][0]]
        said = [f"{r}:{in_collective[r].get('collective')} #{top} ({in_collective[r].get('collective_bytes')} B)"
                for r in (off or at_top)]
    return top, at_top, off, said


def _place(in_collective: Mapping[int, Mapping[str, Any]], ranks: list[int], top: int, world_size: int) -> str:
    """``all_reduce #41 (backward)``, and ``on ranks 0..1`` for a group that is not the whole job."""
    kind = Counter(str(in_collective[r].get("collective")) for r in ranks).most_common(1)[0][0]
    phase = Counter(str(in_collective[r].get("collective_phase") or "") for r in ranks).most_common(1)[0][0]
    e = in_collective[ranks[0]]
    place = f"{kind} #{top}" + (f" ({phase})" if phase else "")
    size, members = e.get("collective_group_size"), e.get("collective_group_ranks")
    if isinstance(size, int) and 0 < size < world_size and members:
        place += f" on ranks {members}"
    return place


def classify(evidence: Mapping[int, Mapping[str, Any]], world_size: int,
             expected: Collection[int] | None = None) -> dict[str, Any]:
    """The ``stall`` event's attributes from each rank's evidence (rank -> its ``stall_evidence`` attributes);
    ``expected``: the ranks that could have reported (default: all ``world_size``), the others are not silent."""
    reported = sorted(evidence)
    silent = sorted(set(range(world_size) if expected is None else expected) - set(reported))
    in_collective = {r: e for r, e in evidence.items() if e.get("collective_state") in ("waiting", "failed")
                     and isinstance(e.get("collective_seq"), int)}
    waiting: list[int] = []
    waiting_in = ""
    mismatched: list[int] = []  # at the top sequence number of their group, in another collective than most ranks
    differ: list[str] = []
    differ_at = ""
    if in_collective:
        # sequence numbers count per process group (a subgroup's collectives advance only its members' counts):
        # compared within each group, whose members are waiting in its latest collective
        by_group: dict[str, list[int]] = {}
        for r, e in in_collective.items():
            by_group.setdefault(str(e.get("collective_group") or ""), []).append(r)
        places = []
        for members in sorted(by_group.values(), key=lambda m: (-len(m), min(m))):
            top, at_top, off, said = _at_top(in_collective, members)
            mismatched += off
            differ += said
            if said and not differ_at:
                differ_at = f"#{top}"
            here = [r for r in at_top if r not in off]
            if here:
                waiting += here
                places.append((here, _place(in_collective, here, top, world_size)))
        waiting.sort()
        mismatched.sort()
        differ = differ[:64]
        waiting_in = "; ".join(place for _, place in places)
        others = "; ".join(f"rank(s) {_rank_list(here)} wait in {place}" for here, place in places)
        stuck = [r for r in reported if r not in waiting]
    else:
        by_phase: dict[str, list[int]] = {}
        for r in reported:
            by_phase.setdefault(str(evidence[r].get("phase", "unknown")), []).append(r)
        largest = max(by_phase.values(), key=len) if by_phase else []
        ties = [g for g in by_phase.values() if len(g) == len(largest)]
        if len(by_phase) > 1 and len(ties) == 1:
            stuck = [r for r in reported if r not in largest]
            waiting = largest
            waiting_in = str(evidence[largest[0]].get("phase", ""))
        else:
            stuck = []
        others = f"rank(s) {_rank_list(waiting)} wait in {waiting_in}" if waiting else ""
    out: dict[str, Any] = {
        "ranks": stuck,
        "phases": [f"{r}:{evidence[r].get('phase', 'unknown')}" for r in stuck],
        "hosts": [str(evidence[r].get("host", "")) for r in stuck],
        "waiting_ranks": waiting,
        "waiting_in": waiting_in,
        "collective_mismatch": differ,
        "silent_ranks": silent,
        "evidence_ranks": reported,
        "step": max((e["step"] for e in evidence.values() if isinstance(e.get("step"), int)), default=-1),
        "stalled_for_s": max((float(e["stalled_for_s"]) for e in evidence.values()
                              if isinstance(e.get("stalled_for_s"), (int, float))), default=0.0),
    }
    others = f" while {others}" if others else ""
    if stuck:
        first = stuck[0]
        out.update(rank=first, phase=str(evidence[first].get("phase", "unknown")), host=out["hosts"][0])
        where = "; ".join(f"rank {r} in " + (f"{evidence[r].get('collective')} #{evidence[r].get('collective_seq')}"
                                               f" ({evidence[r].get('phase', 'unknown')}), another collective"
                                               if r in mismatched else str(evidence[r].get("phase", "unknown")))
                          for r in stuck)
        message = f"stuck: {where}{others}"
    elif differ:
        out.update(rank=-1, phase="", host="")
        message = f"the ranks wait in collectives that differ at {differ_at}: " + "; ".join(
            f"rank {d.replace(':', ' in ', 1)}" for d in differ[:20])
    elif silent and waiting:
        out.update(ranks=silent, phases=[f"{r}:no evidence" for r in silent], hosts=[""] * len(silent),
                   rank=silent[0], phase="no evidence", host="")
        message = f"rank(s) {_rank_list(silent)} gave no evidence (exited, or hung without a watchdog){others}"
        silent = []
    else:
        out.update(rank=-1, phase="", host="")
        place = waiting_in or ", ".join(sorted({str(e.get("phase", "unknown")) for e in evidence.values()}))
        message = f"every rank that reported ({_rank_list(reported)}) is stalled in the same place: {place}"
    if silent:
        message += f"; no evidence from rank(s) {_rank_list(silent)}"
    out["message"] = message
    return out


class StallWatcher:
    """See the module docstring. ``run_dir()`` gives the current attempt's run folder (the agent's own)."""

    def __init__(self, telemetry: Telemetry, world_size: int, *, poll_s: float = 0.5, gather_s: float = 5.0,
                 local_ranks: frozenset[int] | None = None) -> None:
        self.telemetry = telemetry
        self.world_size = world_size
        self.poll_s = poll_s
        self.gather_s = gather_s
        self.local_ranks = local_ranks
        self.reported: set[str] = set()  # run ids whose stall was written
        self.events = 0
        self._followers: dict[Path, _EvidenceFollower] = {}
        self._evidence: dict[str, dict[int, dict[str, Any]]] = {}  # run id -> rank -> first evidence
        self._first_seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False

    def start(self) -> StallWatcher:
        self._thread = threading.Thread(target=self._run, name="telemetrain-stall-watcher", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop the thread, then look one last time (evidence written as the job ended) and decide."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        with contextlib.suppress(Exception):
            self.poll()
            self.decide(final=True)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
                self.decide()
            except Exception as exc:  # noqa: BLE001 - the agent goes on
                if not self._warned:
                    self._warned = True
                    warn_safely(f"telemetrain: the stall watcher failed: {describe(exc)}")

    def poll(self) -> None:
        run_dir = self.telemetry.run_dir
        if run_dir is None or not run_dir.is_dir():
            return
        for path in sorted(run_dir.iterdir()):
            if is_process_file(path.name) and not is_agent_file(path.name) and path not in self._followers:
                self._followers[path] = _EvidenceFollower(path)
        for path, follower in self._followers.items():
            run = path.parent.name  # the run folder is named after the run id
            for rank, attributes in follower.poll():
                if attributes.get("reason") == "stall":
                    self._evidence.setdefault(run, {}).setdefault(rank, attributes)
                    self._first_seen.setdefault(run, time.monotonic())

    def decide(self, final: bool = False) -> None:
        for run, evidence in self._evidence.items():
            if run in self.reported:
                continue
            files = [f for f in self._followers.values() if f.path.parent.name == run and f.rank is not None]
            world = max((f.world_size for f in files if f.world_size), default=self.world_size)
            complete = len(evidence) >= world
            if not (complete or final or time.monotonic() - self._first_seen[run] >= self.gather_s):
                continue
            expected: set[int] | None = None
            if self.local_ranks is not None:
                # which node this agent is comes from the ranks' own files: torchrun's --node-rank is 0 on every
                # node under a dynamic (c10d) rendezvous, which assigns the nodes' ranks itself
                mine = {f.host for f in files if f.host is not None} <= {self.telemetry.identity.host}
                first = min(files, key=lambda f: f.rank or 0, default=None)
                if not mine and first is not None and first.host not in (None, self.telemetry.identity.host):
                    self.reported.add(run)  # a shared run store: the agent of the first rank's node speaks
                    continue
                if mine and world > len(self.local_ranks):
                    # only this node's files (a run store per node): the other nodes' ranks could not be seen
                    expected = {f.rank for f in files if f.rank is not None} | set(evidence)
            self.reported.add(run)
            attributes = classify(evidence, world, expected)
            attributes["run_id"] = run
            self.telemetry.event("stall", attributes, group=GROUP, severity="error")
            self.telemetry.flush(timeout=5.0)
            self.events += 1
