"""Run the peers' own tests against telemetrain, with only their import paths changed (docs/compat.md).

From the repository root: ``python -m tools.peer_contracts --pytorch DIR --one-logger DIR [--extra-path DIR]``.

The peer test files are read from a checkout or git directory of pytorch/pytorch and NVIDIA/nv-one-logger, copied
into a scratch directory outside this repository, rewritten (module paths in imports and in dotted-path strings, per
the mapping tables of docs/compat.md) and run with pytest under the current interpreter, ``PYTHONPATH`` pointing at
this repository's ``src``. The outcome is compared with the expected failures documented in docs/compat.md (kept as
data in expected.py). nv-one-logger's ``docs/example.py`` is run the same way and its output checked: the file
exporter's JSON lines, the run store and ``telemetrain report``.

Exit status: 0 when every failing test is an expected one (and the example checks hold); 1 otherwise; with
``--strict`` also 1 when an expected failure passes (a stale entry). 2 for a usage or setup error.

Nothing of the peers is kept in this repository: the sources are read from wherever the caller has them.
"""
