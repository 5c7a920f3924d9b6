"""Code that keeps torch's own ``torch.monitor`` (its C++ ``Stat`` and ``log_event``), routed into telemetrain by
one call.

    python examples/torch_monitor_bridge.py            # then: telemetrain show

The ``Stat`` and ``log_event`` below are torch's, unchanged: each Stat window becomes one metric per aggregation
(``step_time_ms.mean``, ...) and each event an event record, in the run store. (Or swap the import for
``from telemetrain import monitor`` and skip the bridge: the drop-in closes windows on time, keeps bools, and records
stat windows whole; docs/compat.md.)
"""

from __future__ import annotations

import datetime
import time
from collections import Counter

import torch
import torch.monitor as monitor

import telemetrain
from telemetrain.integrations import torch_monitor
from telemetrain.store import open_run


def main() -> None:
    model = torch.nn.Linear(32, 32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step_time = monitor.Stat("step_time_ms", [monitor.Aggregation.MEAN, monitor.Aggregation.MAX,
                                              monitor.Aggregation.COUNT], datetime.timedelta(milliseconds=20), 1000)
    with torch_monitor.install():  # the default Telemetry (./telemetrain-runs, or $TELEMETRAIN_DIR)
        for step in range(100):
            start = time.perf_counter()
            loss = model(torch.randn(16, 32)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            time.sleep(0.001)  # (the rest of a step)
            step_time.add((time.perf_counter() - start) * 1e3)  # torch closes a 20 ms window at the first add after it
            if (step + 1) % 50 == 0:
                monitor.log_event(monitor.Event("epoch_end", datetime.datetime.now(),
                                                {"step": step + 1, "loss": loss.item()}))
    t = telemetrain.get_telemetry()
    t.close()
    assert t.run_dir is not None
    records = [r for r in open_run(t.run_dir).records() if r.group == "torch.monitor"]
    print("metrics:", ", ".join(f"{name} x{n}" for name, n in sorted(Counter(
        r.name for r in records if r.kind == "metric").items())))
    print("events:", ", ".join(f"{r.name} {r.attributes}" for r in records if r.kind == "event"))
    print(f"wrote {t.run_dir}; see it with: telemetrain show {t.run_dir}")


if __name__ == "__main__":
    main()
