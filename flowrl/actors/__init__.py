"""Stateful Ray actors: rollout workers, worker sets, replay shards, learner threads, learner groups and
aggregators, and the plan resources (replay, learners, aggregators) a Trainer owns beside its workers."""

from flowrl.actors.aggregator import Aggregated, AggregatorSet, AggregatorWorker
from flowrl.actors.learner_group import LearnerGroup
from flowrl.actors.learner_thread import Learned, LearnerThread, Priorities, learn_on_local_worker
from flowrl.actors.replay_actor import ReplayActor, ReplayShards, create_replay_actors
from flowrl.actors.resources import PlanResources, learner_resources
from flowrl.actors.rollout_worker import RolloutWorker, WorkerMetrics, get_global_worker
from flowrl.actors.sampler import EpisodeStats, VectorSampler
from flowrl.actors.worker_set import WorkerSet

__all__ = [
    "Aggregated",
    "AggregatorSet",
    "AggregatorWorker",
    "EpisodeStats",
    "Learned",
    "LearnerGroup",
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
