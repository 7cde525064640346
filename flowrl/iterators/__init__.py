"""The dataflow substrate: lazy local iterators and parallel iterators over Ray actors.

Knows nothing about reinforcement learning. See ``docs/iterators.md``.
"""

from flowrl.iterators.local import LocalIterator, NextValueNotReady
from flowrl.iterators.metrics import MetricsContext, SharedMetrics, TimerStat
from flowrl.iterators.parallel import (
    ParallelIterator,
    ParallelIteratorWorker,
    from_actors,
    from_items,
    from_iterators,
    from_range,
)

__all__ = [
    "LocalIterator",
    "MetricsContext",
    "NextValueNotReady",
    "ParallelIterator",
    "ParallelIteratorWorker",
    "SharedMetrics",
    "TimerStat",
    "from_actors",
    "from_items",
    "from_iterators",
    "from_range",
]
