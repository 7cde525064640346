"""The dataflow substrate: lazy local iterators and parallel iterators over Ray actors.

Knows nothing about reinforcement learning. See ``docs/iterators.md``.
"""

from flowrl.iterators.local import FromActor, LocalIterator, StreamTransform
from flowrl.iterators.metrics import MetricsContext, SharedMetrics, StageStats, TimerStat
from flowrl.iterators.parallel import (
    LATE_ITEMS_COUNTER,
    ParallelIterator,
    from_actors,
    from_items,
    from_iterators,
    from_range,
)
from flowrl.iterators.queues import EventQueue, as_event_queue
from flowrl.iterators.shards import HandOffSpan, ParallelIteratorWorker
from flowrl.iterators.stages import StageNode, callable_name
from flowrl.iterators.union import NextValueNotReady

__all__ = [
    "LATE_ITEMS_COUNTER",
    "EventQueue",
    "FromActor",
    "HandOffSpan",
    "LocalIterator",
    "MetricsContext",
    "NextValueNotReady",
    "ParallelIterator",
    "ParallelIteratorWorker",
    "SharedMetrics",
    "StageNode",
    "StageStats",
    "StreamTransform",
    "TimerStat",
    "as_event_queue",
    "callable_name",
    "from_actors",
    "from_items",
    "from_iterators",
    "from_range",
]
