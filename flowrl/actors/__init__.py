"""Stateful Ray actors: rollout workers, worker sets, replay shards and learner threads."""

from flowrl.actors.learner_thread import LearnerThread
from flowrl.actors.replay_actor import ReplayActor, create_replay_actors
from flowrl.actors.rollout_worker import RolloutWorker, get_global_worker
from flowrl.actors.sampler import EpisodeStats, VectorSampler
from flowrl.actors.worker_set import WorkerSet

__all__ = [
    "EpisodeStats",
    "LearnerThread",
    "ReplayActor",
    "RolloutWorker",
    "VectorSampler",
    "WorkerSet",
    "create_replay_actors",
    "get_global_worker",
]
