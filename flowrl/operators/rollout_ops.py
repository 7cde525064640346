"""Operators that produce and reshape experience: rollouts, gradients from workers, batching."""

from __future__ import annotations

from typing import Any, Iterable, NamedTuple, Sequence

import numpy as np

from flowrl.actors import Aggregated, AggregatorSet, WorkerSet, get_global_worker
from flowrl.data import (
    DEFAULT_POLICY_ID,
    MultiAgentBatch,
    SampleBatch,
    as_policy_batches,
    concat_samples,
)
from flowrl.errors import ConfigError, FlowRLError
from flowrl.iterators import LocalIterator, ParallelIterator, SharedMetrics, from_actors
from flowrl.operators.metric_ops import record_learner_info
from flowrl.operators.names import (
    AGENT_STEPS_SAMPLED_COUNTER,
    STEPS_SAMPLED_COUNTER,
)
from flowrl.operators.protocol import ActorFlow, Operator
from flowrl.operators.train_ops import ComputedGradients
from flowrl.policy.worker_priorities import add_td_errors

Batch = SampleBatch | MultiAgentBatch
ROLLOUT_MODES = ("bulk_sync", "async", "raw")


def count_sampled(env_steps: int, agent_steps: int) -> None:
    """Add to the env-step and agent-step sampled counters of the plan's metrics."""
    metrics = LocalIterator.get_metrics()
    metrics.counters[STEPS_SAMPLED_COUNTER] += env_steps
    metrics.counters[AGENT_STEPS_SAMPLED_COUNTER] += agent_steps


def count_steps_sampled(batch: Batch) -> Batch:
    """Add a batch's env and agent steps to the sampled counters (pass-through)."""
    count_sampled(batch.env_steps(), batch.agent_steps())
    return batch


def rollout_actors(workers: WorkerSet) -> ParallelIterator[Batch]:
    """The remote workers as a parallel iterator whose failed shards the worker set restarts: a request
    pending past ``sample_timeout_s`` fails once the worker set finds its worker hung (not merely slow), and
    a replacement still starting sits the gather out until it has started."""
    return from_actors(
        workers.remote_workers(),
        name="rollout_workers",
        on_shard_failure=workers.on_shard_failure,
        shard_timeout_s=workers.sample_timeout_s,
        supervisor=workers,
    )


class AddWorkerPriorities(Operator):
    """Runs where a fragment was sampled: adds the ``td_error`` column (worker-side priorities) for the
    policies that compute them, with that worker's weights and target networks (pass-through).

    ``worker``: the local worker, when it samples; None inside a remote worker (its process's own).
    """

    def __init__(self, worker: Any = None) -> None:
        self.worker = worker

    def __call__(self, batch: Batch) -> Batch:
        worker = self.worker if self.worker is not None else get_global_worker()
        return add_td_errors(worker.policy_map, batch)


def _check_priorities(workers: WorkerSet) -> None:
    """Every policy whose config asks for worker-side priorities has a TD-error function to compute them."""
    for pid, spec in workers.policy_specs.items():
        if getattr(spec.config, "worker_side_prioritization", False) and spec.kwargs.get("td_error_fn") is None:
            raise ConfigError(
                [
                    f"worker_side_prioritization=True: policy {pid!r} ({spec.policy_class.__name__}) has no "
                    "td_error_fn to compute the priorities of its rows with; set worker_side_prioritization: false"
                ]
            )


def ParallelRollouts(
    workers: WorkerSet, *, mode: str = "bulk_sync", num_async: int = 1, worker_priorities: bool = False
) -> Any:
    """Experience from the rollout workers, counted in ``num_steps_sampled``.

    ``bulk_sync``: one fragment from every worker per item, concatenated (a barrier per
    round; with ``sample_min_fraction`` < 1 a round ends once that fraction of the workers
    delivered, and late fragments join the next round). ``async``: fragments as they arrive,
    ``num_async`` requests in flight per worker. ``raw``: the
    :class:`~flowrl.iterators.ParallelIterator` over the workers, for plans that gather it
    themselves. With no remote workers the local worker samples. Workers that die, raise or
    hang are replaced (or dropped) by the worker set without ending the stream; while a replacement
    waits to start (e.g. for room after a lost node), rounds and gathers go on with the other workers
    (downstream ``ConcatBatches`` takes more of them to fill a train batch).

    ``worker_priorities``: each fragment leaves its worker with the TD errors of its rows (the ``td_error``
    column, see :mod:`flowrl.policy.worker_priorities`), computed there (by the local worker when it samples).
    """
    if mode not in ROLLOUT_MODES:
        raise FlowRLError(f"ParallelRollouts(mode={mode!r}): mode must be one of {ROLLOUT_MODES}")
    if worker_priorities:
        _check_priorities(workers)
    if not workers.remote_workers():
        if mode == "raw":
            raise FlowRLError("ParallelRollouts(mode='raw') needs remote workers (num_workers >= 1)")
        local = workers.local_worker()
        rollouts: LocalIterator[Batch] = LocalIterator(
            lambda timeout: local._sample_forever(), SharedMetrics(), name="local_worker.sample()"
        )
        if worker_priorities:
            rollouts = rollouts.for_each(AddWorkerPriorities(local))
        return rollouts.for_each(count_steps_sampled)
    actors = rollout_actors(workers)
    if worker_priorities:
        actors = actors.for_each(AddWorkerPriorities())
    if mode == "raw":
        return actors
    if mode == "bulk_sync":
        rounds = actors.batch_across_shards(min_fraction=workers.sample_min_fraction)
        return rounds.for_each(concat_samples).for_each(count_steps_sampled)
    return actors.gather_async(num_async=num_async).for_each(count_steps_sampled)


class _CountAggregatedSteps(Operator):
    """Count the steps the aggregators' workers sampled (not the replayed rows mixed in) and pass the item on."""

    def __init__(self, num_rollout_workers: int) -> None:
        self.num_rollout_workers = num_rollout_workers

    def plan_actor_counts(self) -> dict[str, int]:
        """The rollout workers behind the aggregators, which no driver-side gather shows."""
        return {"RolloutWorker": self.num_rollout_workers}

    def plan_links(self) -> list[ActorFlow]:
        """Rollout workers feed the aggregators (a gather inside each), which get the weights back."""
        return [
            ActorFlow("RolloutWorker", "AggregatorWorker", "gather_async"),
            ActorFlow("AggregatorWorker", "RolloutWorker", "forward weights"),
        ]

    def __call__(self, aggregated: Aggregated) -> Any:
        count_sampled(aggregated.env_steps, aggregated.agent_steps)
        return aggregated.item


def AggregatedRollouts(workers: WorkerSet, aggregators: AggregatorSet) -> LocalIterator[Any]:
    """What ``aggregators`` (aggregator actors over the remote rollout workers) serve, as it arrives.

    Each aggregator gathers asynchronously from its group of rollout workers and serves
    the items its stream makes of them (e.g. train batches); the driver counts their
    freshly sampled steps. Weights sent to an aggregator (``set_weights``) reach its
    workers as they next deliver. The aggregators are created and owned outside the plan
    (:class:`~flowrl.actors.PlanResources`); one whose rollout worker failed is recreated
    by the :class:`~flowrl.actors.AggregatorSet`, with the worker restarted, and sits the gather
    out until it has started.
    """
    if not len(aggregators):
        raise FlowRLError("AggregatedRollouts needs at least one aggregator actor")
    return (
        from_actors(list(aggregators), name="aggregators", on_shard_failure=aggregators.replace, supervisor=aggregators)
        .gather_async()
        .for_each(_CountAggregatedSteps(len(workers.remote_workers())))
    )


class _SampledGradients(NamedTuple):
    """What a rollout worker computed on a batch it sampled: its gradients, learner stats and env steps."""

    gradients: list[np.ndarray]
    stats: dict[str, float]
    steps: int


def _sample_and_compute_gradients(batch: Batch) -> _SampledGradients:
    """Runs inside a rollout worker: gradients of its policy on the batch it just sampled."""
    grads, stats = get_global_worker().compute_gradients(as_policy_batches(batch)[DEFAULT_POLICY_ID])
    return _SampledGradients(grads, stats, batch.env_steps())


def _record_gradient_source(item: _SampledGradients) -> ComputedGradients:
    count_sampled(item.steps, item.steps)
    record_learner_info({DEFAULT_POLICY_ID: item.stats})
    return ComputedGradients(item.gradients, item.steps)


def AsyncGradients(workers: WorkerSet) -> LocalIterator[ComputedGradients]:
    """:class:`~flowrl.operators.train_ops.ComputedGradients` computed inside the rollout workers on
    their own samples (A3C).

    Gradients arrive as workers finish; the source worker of each is recorded as the
    metrics context's ``current_actor`` so ``ApplyGradients(update_all=False)`` can send
    new weights back to it alone.
    """
    if not workers.remote_workers():
        raise FlowRLError("AsyncGradients needs remote workers (num_workers >= 1)")
    return (
        rollout_actors(workers).for_each(_sample_and_compute_gradients).gather_async().for_each(_record_gradient_source)
    )


class ConcatBatches:
    """Accumulate batches until they hold ``min_batch_size`` env steps; use with ``combine``.

    Returns ``[]`` while accumulating and ``[batch]`` once enough arrived.
    """

    def __init__(self, min_batch_size: int) -> None:
        if min_batch_size < 1:
            raise FlowRLError(f"ConcatBatches(min_batch_size={min_batch_size}): must be >= 1")
        self.min_batch_size = min_batch_size
        self.buffer: list[Batch] = []
        self.count = 0

    def __call__(self, batch: Batch) -> list[Batch]:
        self.buffer.append(batch)
        self.count += batch.env_steps()
        if self.count < self.min_batch_size:
            return []
        out = concat_samples(self.buffer)
        self.buffer, self.count = [], 0
        return [out]


class SelectExperiences:
    """Keep only the given policies' batches of a :class:`~flowrl.data.MultiAgentBatch`."""

    def __init__(self, policy_ids: Sequence[str]) -> None:
        self.policy_ids = list(policy_ids)

    def __call__(self, batch: Batch) -> Batch:
        if not isinstance(batch, MultiAgentBatch):
            if self.policy_ids != [DEFAULT_POLICY_ID]:
                raise FlowRLError(
                    f"SelectExperiences({self.policy_ids}) got a single-agent batch (policy {DEFAULT_POLICY_ID!r})"
                )
            return batch
        return MultiAgentBatch(
            {pid: b for pid, b in batch.policy_batches.items() if pid in self.policy_ids}, batch.env_steps()
        )


class StandardizeFields:
    """Shift and scale the given columns to mean 0 and std 1 (per policy for multi-agent batches)."""

    def __init__(self, fields: Iterable[str]) -> None:
        self.fields = list(fields)

    def __call__(self, batch: Batch) -> Batch:
        for b in as_policy_batches(batch).values():
            for field in self.fields:
                column = b[field].astype(np.float32)
                b[field] = (column - column.mean()) / max(float(column.std()), 1e-4)
        return batch
