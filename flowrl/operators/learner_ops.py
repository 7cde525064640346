"""Operators around a background learner thread: results in, fresh weights out to the workers."""

from __future__ import annotations

from typing import Any

import ray

from flowrl.actors import LearnerThread, WorkerSet
from flowrl.data import MultiAgentBatch, SampleBatch
from flowrl.iterators import LocalIterator
from flowrl.operators.metric_ops import record_learner_info
from flowrl.operators.names import (
    AGENT_STEPS_TRAINED_COUNTER,
    NUM_LEARNER_UPDATES,
    NUM_WEIGHT_SYNCS,
    STEPS_SAMPLED_COUNTER,
    STEPS_TRAINED_COUNTER,
)

Batch = SampleBatch | MultiAgentBatch


class SendWeightsToSource:
    """Send the learner's weights to the worker a batch came from, when that worker is due.

    Consumes ``(worker, batch)`` (after ``zip_with_source_actor``) and yields the batch. A
    worker is due once it sampled ``min_steps`` env steps and the learner made
    ``min_learner_updates`` updates since its last weights (Ape-X paces by steps, IMPALA by
    updates). Weights go to the object store once per learner update, shared by every worker.
    The sources may be aggregators (tree aggregation) that pass the weights on to their
    workers; ``source_class`` names them in the plan graph.
    """

    def __init__(
        self,
        learner: LearnerThread,
        workers: WorkerSet,
        *,
        min_steps: int = 0,
        min_learner_updates: int = 0,
        source_class: str = "RolloutWorker",
    ) -> None:
        self.learner = learner
        self.source_class = source_class
        self.workers = workers
        self.min_steps = min_steps
        self.min_learner_updates = min_learner_updates
        self.steps_since: dict[Any, int] = {}
        self.version_sent: dict[Any, int] = {}
        self.weights: Any = None
        self.weights_version = -1

    def plan_links(self) -> list[tuple[str, str]]:
        """What this operator does to actors, for the plan graph."""
        return [(self.source_class, "send weights to the source")]

    def __call__(self, item: tuple[Any, Batch]) -> Batch:
        actor, batch = item
        self.steps_since[actor] = self.steps_since.get(actor, 0) + batch.env_steps()
        version = self.learner.num_batches_trained
        if self.steps_since[actor] >= self.min_steps and version - self.version_sent.get(actor, 0) >= self.min_learner_updates:
            if self.weights_version != version:
                with self.learner.lock:  # not halfway through a learner step
                    weights = self.workers.local_worker().get_weights()
                self.weights = ray.put(weights)
                self.weights_version = version
            metrics = LocalIterator.get_metrics()
            actor.set_weights.remote(self.weights, {"timestep": metrics.counters[STEPS_SAMPLED_COUNTER]})
            self.steps_since[actor] = 0
            self.version_sent[actor] = version
            metrics.counters[NUM_WEIGHT_SYNCS] += 1
        return batch


def record_learner_results(item: tuple[Any, dict[str, Any], int]) -> dict[str, Any]:
    """Count what a learner thread trained (its out-queue's ``(source, info, count)``): the steps
    and one learner update; keep its stats beside those of other policies."""
    _, info, count = item
    metrics = LocalIterator.get_metrics()
    metrics.counters[STEPS_TRAINED_COUNTER] += count
    metrics.counters[AGENT_STEPS_TRAINED_COUNTER] += count
    metrics.counters[NUM_LEARNER_UPDATES] += 1
    record_learner_info(info)
    return info
