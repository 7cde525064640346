"""Stateful Ray actors: rollout workers, worker sets, replay shards, learner threads and aggregators."""

from flowrl.actors.aggregator import AggregatorWorker, create_aggregators
from flowrl.actors.learner_thread import LearnerThread
from flowrl.actors.replay_actor import ReplayActor, create_replay_actors
from flowrl.actors.rollout_worker import RolloutWorker, get_global_worker
from flowrl.actors.sampler import EpisodeStats, VectorSampler
from flowrl.actors.worker_set import WorkerSet

__all__ = [
    "AggregatorWorker",
    "EpisodeStats",
    "LearnerThread",
    "ReplayActor",
    "RolloutWorker",
    "VectorSampler",
    "WorkerSet",
    "create_aggregators",
    "create_replay_actors",
    "get_global_worker",
]
