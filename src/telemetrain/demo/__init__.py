"""``telemetrain demo``: a small real training job (next-character prediction on the Python standard library's own
source code, see ``data``) instrumented with telemetrain, writing a run you can read back with ``telemetrain show``.

Importing this package does not import torch; ``telemetrain.demo.train``, ``telemetrain.demo.session`` and
``telemetrain.demo.data`` do.
"""
