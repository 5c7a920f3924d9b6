"""The torchelastic bridge: code that keeps torch's own imports, next to torch alone and to the drop-in module.

Rows (the peers method of ``_method.py``, one process):
  torchelastic        torch's ``metrics.put_metric`` / ``events.record`` with torch's default null handlers: the peer
  bridge              the same torch calls with ``integrations.torchelastic.install(t)``: into the run store
  telemetrain         ``telemetrain.metrics.put_metric`` / ``events.record``: the drop-in (the plain-loop case)

The bridge runs inside torch's own call path (a ``MetricStream`` per call, ``logging`` for events, torch's
``json.dumps`` of every event), so it costs what torch costs plus one metric record; the drop-in skips torch's layers.
"""

from __future__ import annotations

import shutil
import sys
import tempfile

import _method
from _method import measure, new_row, record_with_peer

DISTS = ("torch", "telemetrain")


def main(argv: list[str] | None = None) -> int:
    ap = _method.parser(__doc__, "short smoke run")
    args = _method.parse_args(ap, argv)
    if args.quick:
        args.repeats, args.target_ms, args.min_n, args.max_n, args.warmup_s = 2, 20.0, 500, 100_000, 0.1
    from torch.distributed.elastic import events, metrics

    import telemetrain
    from telemetrain import events as tevents
    from telemetrain import metrics as tmetrics
    from telemetrain.integrations.torchelastic import install

    tmp = tempfile.mkdtemp(prefix="bench_bridge_")
    load_before = _method.loadavg()
    _method.spin(args.warmup_s)
    t = telemetrain.Telemetry(store=tmp, queue_capacity=4 * args.max_n + 10_000, flush_interval=3600.0)
    telemetrain.set_telemetry(t)

    def flush() -> None:
        if not t.flush(timeout=300):
            raise RuntimeError("flush timed out")

    try:
        ev = events.Event(name="bench", source=events.EventSource.WORKER, metadata={"k": "v", "step": 1})
        put = 'put_metric("m", 1, "grp")'
        peer_m = record_with_peer(new_row("torchelastic", 'metrics.put_metric("m", 1, "grp"), null handler',
                                          *measure(put, {"put_metric": metrics.put_metric})), None)
        peer_e = record_with_peer(new_row("torchelastic", 'events.record(prebuilt Event), "null" destination',
                                          *measure("record(ev)", {"record": events.record, "ev": ev})), None)
        bridge = install(t)
        try:
            record_with_peer(new_row("bridge", 'torch metrics.put_metric("m", 1, "grp") -> run store (caller side)',
                                     *measure(put, {"put_metric": metrics.put_metric}, between=flush)), peer_m)
            record_with_peer(new_row("bridge", "torch events.record(prebuilt Event) -> run store (caller side)",
                                     *measure("record(ev)", {"record": events.record, "ev": ev}, between=flush)),
                             peer_e)
        finally:
            bridge.uninstall()
        tev = tevents.Event(name="bench", source=tevents.EventSource.WORKER, metadata={"k": "v", "step": 1})
        record_with_peer(new_row("telemetrain", 'metrics.put_metric("m", 1, "grp") -> run store (the drop-in)',
                                 *measure(put, {"put_metric": tmetrics.put_metric}, between=flush)), peer_m)
        record_with_peer(new_row("telemetrain", "events.record(prebuilt Event) -> run store (the drop-in)",
                                 *measure("record(ev)", {"record": tevents.record, "ev": tev}, between=flush)),
                         peer_e)
    finally:
        t.close()
        shutil.rmtree(tmp, ignore_errors=True)
    load_after = _method.loadavg()
    _method.print_header(DISTS, load_before, load_after)
    table = _method.render_table(
        (("ratio to peer", "---:"), ("peer", "---")),
        lambda r: ("" if r.get("ratio") is None else f"{r['ratio']:.2f}x", r.get("peer") or ""),
    )
    _method.print_report(table, [], args.json, DISTS, (load_before, load_after), args, {})
    return 0


if __name__ == "__main__":
    sys.exit(main())
