"""Code that keeps torch's own ``torch.distributed.elastic`` imports, routed into telemetrain by one call.

    python examples/torchelastic_bridge.py            # then: telemetrain show

``put_metric``, ``@prof`` and ``events.record`` below are torch's, unchanged; without ``install()`` they would go
to torch's null handlers. (Or swap the import for ``from telemetrain import metrics, events`` and skip the bridge:
the drop-in is faster, see BENCHMARKS.md.)
"""

from __future__ import annotations

import time

from torch.distributed.elastic import events, metrics

import telemetrain
from telemetrain.integrations.torchelastic import install


@metrics.prof(group="trainer")  # torch's decorator: <name>.success / .failure / .duration.ms
def train_step(step: int) -> float:
    time.sleep(0.001)
    return 1.0 / (step + 1)


def main() -> None:
    with install():  # the default Telemetry (./telemetrain-runs, or $TELEMETRAIN_DIR); uninstalled at the end
        for step in range(20):
            loss = train_step(step)
            metrics.put_metric("loss", loss, "trainer")
        events.record(events.Event("checkpoint.saved", events.EventSource.WORKER, metadata={"step": 20}))
    t = telemetrain.get_telemetry()
    t.close()
    print(f"wrote {t.run_dir}; see it with: telemetrain show {t.run_dir}")


if __name__ == "__main__":
    main()
