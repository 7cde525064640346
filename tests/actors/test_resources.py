"""Plan resources owned outside the plan: replay shards as Ray actors, their state and statistics, release."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import ray
from fakes import is_dead

from flowrl.actors import LearnerThread, PlanResources, ReplayActor, create_replay_actors
from flowrl.data import LocalReplayBuffer, SampleBatch
from flowrl.errors import CheckpointError
from flowrl.iterators import from_actors

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(120)]


def rows(n: int, start: int = 0) -> SampleBatch:
    return SampleBatch(
        {
            SampleBatch.OBS: np.arange(start, start + n, dtype=np.float32)[:, None],
            SampleBatch.REWARDS: np.ones(n, np.float32),
        }
    )


def test_replay_actor_is_the_ray_actor_of_a_local_replay_buffer() -> None:
    actor = ReplayActor.remote(capacity=16, learning_starts=4, replay_batch_size=3, prioritized=False, seed=0)
    try:
        assert ray.get(actor.replay.remote()) is None  # before learning_starts
        ray.get(actor.add_batch.remote(rows(6)))
        assert ray.get(actor.replay.remote()).count == 3
        assert ray.get(actor.stats.remote())["num_steps_added"] == 6
        # Also a parallel-iterator shard that yields replayed batches.
        batch = next(iter(from_actors([actor]).gather_async().filter(lambda b: b is not None)))
        assert batch.count == 3
    finally:
        ray.kill(actor)


def test_create_replay_actors_splits_the_capacity_and_learning_starts() -> None:
    shards = create_replay_actors(2, capacity=10, learning_starts=6, replay_batch_size=2, seed=1)
    try:
        ray.get([shard.add_batch.remote(rows(3)) for shard in shards])
        assert all(b is not None for b in ray.get([shard.replay.remote() for shard in shards]))  # 3 >= 6 // 2 each
        stats = ray.get([shard.stats.remote() for shard in shards])
        assert [s["policies"]["default_policy"]["capacity"] for s in stats] == [5, 5]
    finally:
        for shard in shards:
            ray.kill(shard)


class IdleWorker:
    """A local worker the learner thread never gets a batch for."""

    lock = threading.RLock()


def test_plan_resources_checkpoint_report_and_release_what_they_hold() -> None:
    shards = create_replay_actors(2, capacity=20, learning_starts=0, replay_batch_size=2, seed=0)
    learner = LearnerThread(IdleWorker(), inqueue_size=4)  # type: ignore[arg-type]
    learner.start()
    buffer = LocalReplayBuffer(capacity=8, learning_starts=0, replay_batch_size=2, seed=0)
    buffer.add_batch(rows(5))
    resources = PlanResources(
        replay_buffer=buffer, replay_actors=shards, learner=learner, checkpoint_replay_contents=True
    )
    ray.get([shard.add_batch.remote(rows(4, 10 * i)) for i, shard in enumerate(shards)])

    stats = resources.stats()
    assert stats["learner_thread"]["inqueue_capacity"] == 4 and stats["learner_thread"]["alive"]
    assert stats["replay_buffer"]["num_steps_added"] == 5
    assert [s["num_steps_added"] for s in stats["replay_shards"]] == [4, 4]

    state = resources.get_state()
    fresh_shards = create_replay_actors(2, capacity=20, learning_starts=0, replay_batch_size=2, seed=0)
    fresh = PlanResources(
        replay_buffer=LocalReplayBuffer(capacity=8, learning_starts=0, replay_batch_size=2), replay_actors=fresh_shards
    )
    fresh.set_state(state)
    assert fresh.stats()["replay_buffer"]["num_steps_added"] == 5
    assert [s["num_steps_added"] for s in fresh.stats()["replay_shards"]] == [4, 4]
    with pytest.raises(CheckpointError, match="2 replay shards, this run has 1"):
        PlanResources(replay_actors=fresh_shards[:1]).set_state(state)

    resources.stop()
    fresh.stop()
    assert not learner.is_alive()
    assert all(is_dead(shard) for shard in [*shards, *fresh_shards])
    resources.stop()  # idempotent
