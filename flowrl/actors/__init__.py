"""Stateful Ray actors: rollout workers, worker sets, replay shards, learner threads, learner groups and
aggregators, and the plan resources (replay, learners, aggregators) a Trainer owns beside its workers.

Each name is imported from its module on first use (:func:`~flowrl.deferred.deferred_attributes`):
the package itself loads neither PyTorch nor Ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowrl.deferred import deferred_attributes

if TYPE_CHECKING:
    from flowrl.actors.aggregator import Aggregated, AggregatorSet, AggregatorWorker
    from flowrl.actors.learned import Learned, LearnerInfo, Priorities
    from flowrl.actors.learner_group import LearnerGroup
    from flowrl.actors.learner_thread import LearnerThread, learn_on_local_worker
    from flowrl.actors.replay_actor import ReplayActor
    from flowrl.actors.replay_shards import ReplayShards, create_replay_actors
    from flowrl.actors.resources import PlanResources, learner_resources
    from flowrl.actors.rollout_worker import RolloutWorker, WorkerMetrics, get_global_worker
    from flowrl.actors.sampling.recovery import EpisodeStats
    from flowrl.actors.sampling.vector import VectorSampler
    from flowrl.actors.worker_set import WorkerSet

__all__ = [
    "Aggregated",
    "AggregatorSet",
    "AggregatorWorker",
    "EpisodeStats",
    "Learned",
    "LearnerGroup",
    "LearnerInfo",
    "LearnerThread",
    "PlanResources",
    "Priorities",
    "ReplayActor",
    "ReplayShards",
    "RolloutWorker",
    "VectorSampler",
    "WorkerMetrics",
    "WorkerSet",
    "create_replay_actors",
    "get_global_worker",
    "learn_on_local_worker",
    "learner_resources",
]

__getattr__ = deferred_attributes(
    __name__,
    {
        "flowrl.actors.aggregator": ["Aggregated", "AggregatorSet", "AggregatorWorker"],
        "flowrl.actors.learned": ["Learned", "LearnerInfo", "Priorities"],
        "flowrl.actors.learner_group": ["LearnerGroup"],
        "flowrl.actors.learner_thread": ["LearnerThread", "learn_on_local_worker"],
        "flowrl.actors.replay_actor": ["ReplayActor"],
        "flowrl.actors.replay_shards": ["ReplayShards", "create_replay_actors"],
        "flowrl.actors.resources": ["PlanResources", "learner_resources"],
        "flowrl.actors.rollout_worker": ["RolloutWorker", "WorkerMetrics", "get_global_worker"],
        "flowrl.actors.sampling.recovery": ["EpisodeStats"],
        "flowrl.actors.sampling.vector": ["VectorSampler"],
        "flowrl.actors.worker_set": ["WorkerSet"],
    },
)
