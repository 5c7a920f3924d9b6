"""``goodput_by_rank`` at scale: every rank's report is exactly ``goodput(rank=...)`` (a restarted session of four
ranks, checkpoints on another rank, reports with energy), on both paths; and the session is walked once for all
ranks, not once per rank (thousands of ranks made that ~ranks^2: in Python, and by SQL with energy, where each
report loaded every rank again)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("duckdb")

from conftest import logged_queries
from telemetrain.analysis.goodput_view import by_rank_entry, full_by_rank_entry
from telemetrain.store.compact import COLUMNAR_DIR
from telemetrain.training import goodput_sql
from telemetrain.training.goodput import goodput, goodput_by_rank
from test_report import _write_session  # (two runs: a crash after a checkpoint, then a resume)

pytestmark = pytest.mark.filterwarnings("ignore:telemetrain. sink 'broken' failed")


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The restarted session, its reports given energy (as a GPU job's are): 10 J a window iteration."""
    runs = _write_session(tmp_path_factory.mktemp("store"))
    for f in sorted(p for run in runs for p in run.glob("*.jsonl")):
        out = []
        for line in f.read_text().splitlines(keepends=True):
            if '"training_metrics_update"' in line:
                try:
                    record = json.loads(line)
                except ValueError:
                    out.append(line)
                    continue
                record["attributes"]["window_energy_J"] = 10.0 * record["attributes"]["window_iterations"]
                line = json.dumps(record, separators=(",", ":")) + "\n"
            out.append(line)
        f.write_text("".join(out))
    for columnar in runs[0].parent.rglob(COLUMNAR_DIR):
        shutil.rmtree(columnar)
    return runs[0].parent


def test_by_rank_is_each_ranks_goodput(session: Path, engine: str) -> None:
    by_rank = goodput_by_rank(session)
    assert sorted(by_rank) == [0, 1, 2, 3]
    for rank, report in by_rank.items():
        alone = goodput(session, rank=rank)
        assert report.as_dict() == alone.as_dict(), rank
    first = by_rank[0]
    assert len(first.runs) == 2 and first.lost_iterations > 0 and first.runs[0].status != "finished"
    assert first.energy is not None and first.energy.as_dict() == by_rank[3].energy.as_dict()  # type: ignore[union-attr]


class _Walked(list[Any]):
    """A run's processes, counting the walks over them."""

    walks = 0

    def __iter__(self) -> Any:
        _Walked.walks += 1
        return super().__iter__()


def test_by_rank_walks_the_session_once_in_python(session: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "python")
    module = sys.modules["telemetrain.training.goodput"]  # (the package's ``goodput`` is the function)
    load = module._load

    def counted(*args: Any, **kwargs: Any) -> Any:
        s = load(*args, **kwargs)
        for d in s.runs:
            d.processes = _Walked(d.processes)
        return s

    monkeypatch.setattr(module, "_load", counted)
    _Walked.walks = 0
    assert len(goodput_by_rank(session)) == 4
    # a fixed few walks of each run's processes for all ranks (each rank's report walked them three times or more)
    assert _Walked.walks <= 2 * 3


@pytest.mark.parametrize("batch_rows", [goodput_sql.BATCH_ROWS, 5], ids=["one-batch", "rank-by-rank"])
def test_by_rank_loads_each_batch_once_by_sql_with_energy(session: Path, batch_rows: int,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The energy account is the job's: read once (each batch of ranks loaded once), then each batch once for the
    reports; each report loaded every other batch's ranks again (~ranks^2 queries over every file of the run)."""
    monkeypatch.setenv("TELEMETRAIN_ENGINE", "duckdb")
    monkeypatch.setattr(goodput_sql, "BATCH_ROWS", batch_rows)
    queries = logged_queries(monkeypatch)
    assert len(goodput_by_rank(session)) == 4
    loads = [q for q in queries if "count(*), min(line), max(line)" in q]  # one a ``load_rank`` that reads rows
    # the four short ranks together: loaded once; a rank at a time: once for the energy, once for the reports
    assert len(loads) == (1 if batch_rows > 5 else 2 * 4)


@pytest.mark.parametrize("engine", ["python", "duckdb"])
def test_the_cli_reads_the_session_once_with_by_rank(session: Path, engine: str, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``goodput --by-rank`` read (and converted) the session twice: once for the chosen rank, once for every rank.
    Its top report is the chosen rank's all the same, and a rank without records gets goodput's own error."""
    from telemetrain import cli

    monkeypatch.setenv("TELEMETRAIN_ENGINE", engine)
    module = sys.modules["telemetrain.training.goodput"]
    load = module._load
    loads: list[Any] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        loads.append(args)
        return load(*args, **kwargs)

    monkeypatch.setattr(module, "_load", counted)
    assert cli.main(["goodput", str(session), "--rank", "2", "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)
    loads.clear()
    assert cli.main(["goodput", str(session), "--rank", "2", "--by-rank", "--json"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert len(loads) == 1
    by_rank = both.pop("by_rank")
    assert both == alone == full_by_rank_entry(by_rank["2"], both) and sorted(by_rank) == ["0", "1", "2", "3"]
    assert cli.main(["goodput", str(session), "--rank", "9", "--by-rank"]) == 2
    assert "rank 9 wrote no training lifecycle record" in capsys.readouterr().err


def test_the_by_rank_json_is_written_a_rank_at_a_time_as_one_document(session: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The text is exactly one ``json.dumps`` of the whole (written a rank at a time: the whole at 2,048 ranks held
    ~1 GiB), each rank's report less the session's ranks and energy (``by_rank_entry``)."""
    from telemetrain import cli
    from telemetrain.cli_common import json_value

    dumps = json.dumps
    whole: list[bool] = []

    def watched(obj: Any, **kwargs: Any) -> str:
        whole.append(isinstance(obj, dict) and "by_rank" in obj)
        return dumps(obj, **kwargs)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(json, "dumps", watched)
        assert cli.main(["goodput", str(session), "--by-rank", "--json"]) == 0
    text = capsys.readouterr().out
    assert whole and not any(whole)  # never the whole document as one object
    data = goodput(session).as_dict()
    data["by_rank"] = {str(rank): by_rank_entry(r.as_dict(), data) for rank, r in goodput_by_rank(session).items()}
    assert all("ranks" not in e and "energy" not in e and all("ranks" not in run for run in e["runs"])
               for e in data["by_rank"].values()) and "energy" in data
    assert text == json.dumps(json_value(data), indent=2, allow_nan=False) + "\n"


def _scalars(value: Any) -> int:
    """The numbers, strings, bools and nulls a JSON value holds."""
    if isinstance(value, dict):
        return sum(_scalars(v) for v in value.values())
    if isinstance(value, list):
        return sum(_scalars(v) for v in value)
    return 1


def test_the_by_rank_json_grows_linearly_with_the_ranks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``goodput --by-rank --json`` of generated runs of 16 and 64 ranks: each rank's entry holds as many values at 64
    ranks as at 16 (it listed the session's ranks, and each run's: ~ranks^2 in all), and with the top level it is
    that rank's whole report."""
    import subprocess

    from telemetrain import cli

    sizes = {}
    for ranks in (16, 64):
        root = tmp_path / str(ranks)
        subprocess.run([sys.executable, str(Path(__file__).parents[1] / "bench" / "gen_many_ranks.py"), str(root),
                        str(ranks), "60"], check=True, capture_output=True)
        assert cli.main(["goodput", str(root / "scale"), "--by-rank", "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        entries = data.pop("by_rank")
        assert len(entries) == ranks and len(data["ranks"]) == ranks
        sizes[ranks] = {_scalars(e) for e in entries.values()}
        whole = {str(rank): r.as_dict() for rank, r in goodput_by_rank(root / "scale").items()}
        assert {rank: full_by_rank_entry(e, data) for rank, e in entries.items()} == whole
    assert sizes[16] == sizes[64] and len(sizes[16]) == 1
