"""Multi-rank jobs: the launcher (``telemetrain launch``), cross-rank aggregation and straggler detection.

Importing this package does not import torch; the exchange and the launcher do, when they run.
"""

from .cross_rank import CrossRankAggregator, enable_cross_rank
from .stragglers import Finding, StragglerDetector

__all__ = ["CrossRankAggregator", "Finding", "StragglerDetector", "enable_cross_rank"]
