"""Multi-rank jobs: the launcher, cross-rank aggregation and straggler detection."""
