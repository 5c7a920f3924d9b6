"""Multi-rank jobs: the launcher (``telemetrain launch``), cross-rank aggregation, straggler detection and late-rank
attribution, communication timing, the stall watchdog, and clock alignment.

Importing this package does not import torch; the exchange, the launcher and the communication hooks do, when they
run.
"""

from .comm import CommMonitor, comm_monitor, instrument_ddp, instrument_fsdp
from .cross_rank import CrossRankAggregator, enable_cross_rank
from .late_rank import LateRankAttributor
from .stragglers import Finding, StragglerDetector
from .watchdog import StallWatchdog, enable_watchdog
from .watchdog_config import WatchdogConfig

__all__ = ["CommMonitor", "CrossRankAggregator", "Finding", "LateRankAttributor", "StallWatchdog",
           "StragglerDetector", "WatchdogConfig", "comm_monitor", "enable_cross_rank", "enable_watchdog",
           "instrument_ddp", "instrument_fsdp"]
