"""Aggregator actors for tree aggregation: each gathers experience from its own group of rollout workers.

With many rollout workers, one driver process that receives every fragment, concatenates
train batches and sends weights back becomes the bottleneck. Aggregators take that work
off it: each runs a gather over a group of rollout workers *inside its own process* (a
parallel iterator consumed in another actor), applies the plan's batching there, and
hands the driver a few large train batches. Weights flow back down the same tree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import ray

from flowrl.errors import FlowRLError
from flowrl.iterators import LocalIterator, ParallelIteratorWorker, from_actors

StreamFn = Callable[[LocalIterator[Any]], LocalIterator[Any]]


class Aggregated(NamedTuple):
    """An item an aggregator made (e.g. a train batch) and the env and agent steps its workers
    freshly sampled since the one before (replayed rows mixed in are not counted)."""

    item: Any
    env_steps: int
    agent_steps: int


class AggregatorWorker(ParallelIteratorWorker):
    """Gathers fragments from ``rollout_workers`` and serves what ``make_stream`` makes of them.

    ``make_stream`` receives the gathered fragments as a :class:`~flowrl.iterators.LocalIterator`
    (``num_async`` requests in flight per worker) and returns an iterator, e.g. with
    ``MixInReplay`` and ``ConcatBatches`` applied. The shard yields :class:`Aggregated`
    items: each item with the steps sampled since the one before. Weights set with
    :meth:`set_weights` are forwarded to each rollout worker of the group the next time
    it delivers a fragment, so its next sample uses them.

    A rollout worker of the group that dies ends this actor's stream with a
    :class:`~flowrl.errors.ShardFailedError` naming it (aggregators do not replace workers).
    """

    def __init__(self, rollout_workers: Sequence[Any], make_stream: StreamFn, num_async: int = 2) -> None:
        if not rollout_workers:
            raise FlowRLError("AggregatorWorker needs at least one rollout worker")
        self.rollout_workers = list(rollout_workers)
        self.make_stream = make_stream
        self.num_async = num_async
        self.weights: Any = None
        self.global_vars: Mapping[str, Any] | None = None
        self.weights_version = 0
        self.version_sent: dict[Any, int] = {}
        self.env_steps = self.agent_steps = 0
        super().__init__(self._stream)

    def _stream(self) -> Iterator[Aggregated]:
        fragments = (
            from_actors(self.rollout_workers, name="rollout_workers")
            .gather_async(num_async=self.num_async)
            .zip_with_source_actor()
            .for_each(self._forward_weights)
        )
        for item in self.make_stream(fragments):
            # The steps freshly sampled since the last item: replayed rows must not count as sampled.
            yield Aggregated(item, self.env_steps, self.agent_steps)
            self.env_steps = self.agent_steps = 0

    def _forward_weights(self, item: tuple[Any, Any]) -> Any:
        worker, fragment = item
        self.env_steps += fragment.env_steps()
        self.agent_steps += fragment.agent_steps()
        if self.weights is not None and self.version_sent.get(worker, 0) < self.weights_version:
            worker.set_weights.remote(self.weights, self.global_vars)
            self.version_sent[worker] = self.weights_version
        return fragment

    def set_weights(self, weights: Mapping[str, Any], global_vars: Mapping[str, Any] | None = None) -> None:
        """New weights for the group: stored once in the object store, forwarded worker by worker."""
        self.weights = ray.put(dict(weights))
        self.global_vars = global_vars
        self.weights_version += 1

    def ping(self) -> str:
        """Answer a health check."""
        return "pong"


def create_aggregators(rollout_workers: Sequence[Any], num_aggregators: int, make_stream: StreamFn, num_cpus: float = 0.5) -> list[Any]:
    """``num_aggregators`` aggregator actors, rollout workers dealt to them round robin."""
    if not 1 <= num_aggregators <= len(rollout_workers):
        raise FlowRLError(
            f"num_aggregation_workers={num_aggregators} must be between 1 and the number of rollout workers "
            f"({len(rollout_workers)}): each aggregator gathers from at least one worker"
        )
    remote_cls = ray.remote(num_cpus=num_cpus, max_restarts=0)(AggregatorWorker)
    groups = [list(rollout_workers[i::num_aggregators]) for i in range(num_aggregators)]
    return [remote_cls.remote(group, make_stream) for group in groups]
