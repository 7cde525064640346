"""Sending the learner's weights to rollout workers: timed and counted the same way by every operator."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flowrl.actors.protocols import WorkerSetLike
from flowrl.iterators import LocalIterator
from flowrl.operators.names import NUM_WEIGHT_SYNCS, STEPS_SAMPLED_COUNTER, WORKER_UPDATE_TIMER


def global_vars() -> dict[str, Any]:
    """The run-wide variables policies receive with new weights: the env steps sampled so far."""
    return {"timestep": LocalIterator.get_metrics().counters[STEPS_SAMPLED_COUNTER]}


def timestep_to_learner(workers: WorkerSetLike) -> None:
    """Give the local worker's policies, which learn, the env steps sampled so far, before they learn:
    their schedules (``lr_schedule``, ``entropy_coeff_schedule``) read it. Weight syncs bring it to the
    rollout workers; a learner that takes none (a learner thread's, A3C's) would otherwise never see it."""
    workers.local_worker().set_global_vars(global_vars())


def broadcast_weights(workers: WorkerSetLike, policies: Sequence[str] | None = None) -> None:
    """Send the local worker's weights (of ``policies``, default all) to every remote worker.

    Timed as ``update`` and counted in ``num_weight_syncs``.
    """
    metrics = LocalIterator.get_metrics()
    with metrics.timers[WORKER_UPDATE_TIMER]:
        workers.sync_weights(list(policies) if policies is not None else None, global_vars=global_vars())
    metrics.counters[NUM_WEIGHT_SYNCS] += 1


def send_weights(workers: WorkerSetLike, actor: Any, weights: Any, targets: Any = None) -> None:
    """Send ``weights`` (per policy id, or their object ref) to one of ``workers``' actors (or an
    aggregator over them), with ``targets`` (target networks' weights per policy id, or their ref) if
    given; timed and counted like a broadcast. The worker set remembers the global vars sent, for a
    worker that replaces a failed one."""
    metrics = LocalIterator.get_metrics()
    with metrics.timers[WORKER_UPDATE_TIMER]:
        variables = global_vars()
        actor.set_weights.remote(weights, variables, *([] if targets is None else [targets]))
        workers.remember_global_vars(variables)
    metrics.counters[NUM_WEIGHT_SYNCS] += 1
