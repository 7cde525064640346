"""Operators around a background learner thread: batches in, results out, fresh weights to the workers."""

from __future__ import annotations

from typing import Any, NamedTuple

from flowrl.actors import Learned, LearnerThread
from flowrl.actors.protocols import WorkerSetLike
from flowrl.actors.target_sync import TargetSync
from flowrl.data import MultiAgentBatch, SampleBatch
from flowrl.deferred import ray
from flowrl.iterators import FromActor, LocalIterator
from flowrl.operators.concurrency_ops import Dequeue, Enqueue
from flowrl.operators.metric_ops import record_learner_info
from flowrl.operators.names import (
    AGENT_STEPS_TRAINED_COUNTER,
    NUM_LEARNER_UPDATES,
    STEPS_TRAINED_COUNTER,
)
from flowrl.operators.protocol import ActorLink, Operator, PlanLink
from flowrl.operators.train_ops import learner_group_counts, learner_group_links
from flowrl.operators.weight_sync import send_weights, timestep_to_learner

Batch = SampleBatch | MultiAgentBatch


class SendWeightsToSource(Operator):
    """Send the learner's weights to the worker a batch came from, when that worker is due.

    Consumes ``FromActor(worker, batch)`` (after ``zip_with_source_actor``) and yields the
    batch. A worker is due once it sampled ``min_steps`` env steps and the learner made
    ``min_learner_updates`` updates since its last weights (Ape-X paces by steps, IMPALA by
    updates). Weights go to the object store once per learner update, shared by every worker.
    The sources may be aggregators (tree aggregation) that pass the weights on to their
    workers; ``source_class`` names them in the plan graph.
    """

    def __init__(
        self,
        learner: LearnerThread,
        workers: WorkerSetLike,
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
        # Target networks go along (worker-side priorities) only to a worker that lacks their current version.
        self.target_sync = TargetSync()
        # Policy lag: learner updates between the weights a batch's actor was last sent and the batch's arrival.
        self.policy_lag_total = 0
        self.batches_received = 0

    def plan_links(self) -> list[ActorLink]:
        """Sends weights back to the actor each batch came from."""
        return [ActorLink(self.source_class, "send weights to the source")]

    def plan_stats(self) -> dict[str, float]:
        """The batches received and their policy lags summed (learner updates since their actor's weights were sent)."""
        return {"batches_received": self.batches_received, "policy_lag_total": self.policy_lag_total}

    def __call__(self, item: FromActor[Batch]) -> Batch:
        actor, batch = item.actor, item.item
        # The learner thread's policies take the count of steps sampled as it grows (setting an int: no lock).
        timestep_to_learner(self.workers)
        self.steps_since[actor] = self.steps_since.get(actor, 0) + batch.env_steps()
        version = self.learner.num_batches_trained
        self.policy_lag_total += version - self.version_sent.get(actor, 0)
        self.batches_received += 1
        if (
            self.steps_since[actor] >= self.min_steps
            and version - self.version_sent.get(actor, 0) >= self.min_learner_updates
        ):
            local = self.workers.local_worker()
            with self.learner.lock:  # not halfway through a learner step or a target update
                weights = local.get_weights() if self.weights_version != version else None
                targets = self.target_sync.targets_for(actor, local.policy_map)
            if weights is not None:
                self.weights = ray.put(weights)
                self.weights_version = version
            send_weights(self.workers, actor, self.weights, targets)
            self.steps_since[actor] = 0
            self.version_sent[actor] = version
        return batch


class RecordLearnerResults(Operator):
    """:func:`record_learner_results` for ``learner``'s results; the plan graph shows its learner group, if any."""

    def __init__(self, learner: LearnerThread) -> None:
        self.learners = learner.learners

    def plan_links(self) -> list[PlanLink]:
        return learner_group_links(self.learners, driven_by="LearnerThread")

    def plan_actor_counts(self) -> dict[str, int]:
        return learner_group_counts(self.learners)

    def __call__(self, learned: Learned) -> Learned:
        return record_learner_results(learned)


def record_learner_results(learned: Learned) -> Learned:
    """Count what a learner thread trained: its steps and one learner update; keep its stats
    beside those of other policies (pass-through)."""
    metrics = LocalIterator.get_metrics()
    metrics.counters[STEPS_TRAINED_COUNTER] += learned.steps
    metrics.counters[AGENT_STEPS_TRAINED_COUNTER] += learned.steps
    metrics.counters[NUM_LEARNER_UPDATES] += 1
    record_learner_info(learned.info)
    return learned


class LearnerFlows(NamedTuple):
    """The two sub-flows around a learner thread, to run side by side (``Concurrently``)."""

    #: Puts each batch (or ``FromActor(shard, batch)``) on the learner's queue; yields what it enqueued.
    enqueue: LocalIterator[Any]
    #: The learner's :class:`~flowrl.actors.Learned` results, counted as trained.
    learned: LocalIterator[Learned]


def LearnInThread(batches: LocalIterator[Any], learner: LearnerThread) -> LearnerFlows:
    """Train ``learner`` on ``batches`` in its own thread: the enqueue sub-flow and the results sub-flow.

    The asynchronous plans (Ape-X, IMPALA, APPO) join the two with ``Concurrently(mode="async")``
    and continue from ``learned`` (priorities, target updates, metrics).
    """
    enqueue = batches.transform(Enqueue(learner.inqueue))
    learned = Dequeue(learner.outqueue, check=learner.check).for_each(RecordLearnerResults(learner))
    return LearnerFlows(enqueue, learned)
