"""The run store: layout, line format (v1) and the crash-tolerant reader."""

from .layout import default_root, process_file_name, run_dir
from .reader import NotARunError, ProcessLog, Run, find_runs, open_run

__all__ = ["NotARunError", "ProcessLog", "Run", "default_root", "find_runs", "open_run", "process_file_name", "run_dir"]
