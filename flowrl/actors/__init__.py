"""Stateful Ray actors: rollout workers, worker sets, replay shards, learner threads and aggregators,
and the plan resources (replay, learner, aggregators) a Trainer owns beside its workers."""

from flowrl.actors.aggregator import Aggregated, AggregatorSet, AggregatorWorker
from flowrl.actors.learner_thread import Learned, LearnerThread, Priorities, learn_on_local_worker
from flowrl.actors.replay_actor import ReplayActor, ReplayShards, create_replay_actors
from flowrl.actors.resources import PlanResources, no_resources
from flowrl.actors.rollout_worker import RolloutWorker, WorkerMetrics, get_global_worker
from flowrl.actors.sampler import EpisodeStats, VectorSampler
from flowrl.actors.worker_set import WorkerSet

__all__ = [
    "Aggregated",
    "AggregatorSet",
    "AggregatorWorker",
    "EpisodeStats",
    "Learned",
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
    "no_resources",
]
