"""bench_gpu.py's results: each check's verdict recorded, logged and written to ``--json`` after every check (so
a crash keeps what was measured), a check that raises failed with its traceback, the machine described, the summary
and the exit status without CUDA."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import sys
from pathlib import Path
from typing import Any

RESULTS: dict[str, Any] = {}
JSON_PATH: list[Path] = []  # where --json writes; rewritten after every check, so a crash keeps what was measured


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def check(name: str, ok: bool, detail: str, **values: Any) -> None:
    RESULTS[name] = {"ok": ok, "detail": detail, **values}
    log(f"[{'PASS' if ok else 'FAIL'}] {name}: {detail}")
    for path in JSON_PATH:
        path.write_text(json.dumps(RESULTS, indent=1, default=str))


def guarded(name: str, run: Any) -> None:
    """Runs one check; an exception fails that check, with its traceback, and the next check still runs (a lent GPU's
    minutes are few: one broken check must not cost the others' numbers)."""
    try:
        run()
    except Exception as exc:  # noqa: BLE001 - the check's failure, recorded
        import traceback

        check(name, False, f"raised {type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        log(traceback.format_exc())


def no_cuda(reason: str) -> int:
    """Exit status 2: nothing measured, said on stderr and, with ``--json``, in the file (a script that collects it
    finds why rather than no file)."""
    print(reason, file=sys.stderr)
    for path in JSON_PATH:
        path.write_text(json.dumps({"skipped": reason}, indent=1))
    return 2


def summary() -> int:
    """The checks' verdicts on stdout (the full results are in ``--json``); 0 when all passed, 1 otherwise."""
    failed = [k for k, v in RESULTS.items() if isinstance(v, dict) and v.get("ok") is False]
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk in ("ok", "detail")} if isinstance(v, dict)
                      and "ok" in v else v for k, v in RESULTS.items()}, indent=1, default=str))
    for path in JSON_PATH:
        path.write_text(json.dumps(RESULTS, indent=1, default=str))
    print(f"\n{len(failed)} check(s) failed: {', '.join(failed)}" if failed else "\nall checks passed")
    return 1 if failed else 0


def describe_machine(torch: Any) -> None:
    device_name = torch.cuda.get_device_name()
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    driver = ""
    with contextlib.suppress(Exception):
        import pynvml

        pynvml.nvmlInit()
        driver = str(pynvml.nvmlSystemGetDriverVersion())
    machine = {"device": device_name, "driver": driver, "cuda": torch.version.cuda, "torch": torch.__version__,
               "sms": props.multi_processor_count, "memory_GiB": round(props.total_memory / 2**30, 1),
               "python": platform.python_version(), "host": platform.node(), "cpus": os.cpu_count(),
               "nvidia_smi": shutil.which("nvidia-smi") or "not found"}
    log(f"machine: {machine}")
    RESULTS["machine"] = machine
    for path in JSON_PATH:
        path.write_text(json.dumps(RESULTS, indent=1, default=str))
