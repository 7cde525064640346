"""Replay shards survive faults: a dead shard is recreated empty and counted once, replay
writes and priority updates are bounded and their errors reach the driver."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import ray
from fakes import is_dead

from flowrl import Trainer
from flowrl.actors import Learned, PlanResources, ReplayShards, create_replay_actors
from flowrl.actors.restart_budget import RestartBudget
from flowrl.data import SampleBatch
from flowrl.errors import ReplayShardError, ShardFailedError, WorkerFailureError
from flowrl.iterators import LocalIterator, NextValueNotReady
from flowrl.operators import STEPS_SAMPLED_COUNTER, Replay, StoreToReplayBuffer, ThrottleSampling, UpdatePriorities
from flowrl.operators.replay_ops import _ReplaceFailedShard

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(300)]


def no_faults(**counts: int) -> dict[str, int]:
    """PlanResources.fault_counters() with every count 0 but ``counts``."""
    return {
        "num_replay_shard_restarts": 0,
        "num_lost_replay_calls": 0,
        "num_aggregator_restarts": 0,
        "num_learner_restarts": 0,
        **counts,
    }


def rows(n: int, start: int = 0) -> SampleBatch:
    obs = np.arange(start, start + n, dtype=np.float32)[:, None]
    return SampleBatch({SampleBatch.OBS: obs, SampleBatch.REWARDS: np.ones(n, np.float32)})


def shard_tier(num_shards: int = 1, learning_starts: int = 0) -> ReplayShards:
    return create_replay_actors(
        num_shards, capacity=100 * num_shards, learning_starts=learning_starts, replay_batch_size=2, seed=0
    )


def kill(actor: Any) -> None:
    ray.kill(actor)
    assert is_dead(actor)


def steps_added(actor: Any) -> int:
    return int(ray.get(actor.stats.remote(), timeout=60)["num_steps_added"])


def test_a_dead_shard_is_replaced_empty_in_place_and_counted_once() -> None:
    shards = shard_tier(2)
    try:
        dead, other = shards[0], shards[1]
        ray.get([shard.add_batch.remote(rows(4)) for shard in shards])
        kill(dead)
        replacement = shards.replace(dead, RuntimeError("gone"))
        # A second report of the same dead shard (another operator saw it too) gets the same replacement.
        assert shards.replace(dead) is replacement
        assert shards.num_restarts == 1 and shards.was_replaced(dead) and not shards.was_replaced(replacement)
        assert list(shards) == [replacement, other] and len(shards) == 2
        assert steps_added(replacement) == 0 and steps_added(other) == 4
        # The replacement has the dead shard's settings (half of the capacity each).
        ray.get(replacement.add_batch.remote(rows(3)))
        assert ray.get(replacement.stats.remote())["policies"]["default_policy"]["capacity"] == 100
        assert PlanResources(replay_actors=shards).fault_counters() == no_faults(num_replay_shard_restarts=1)
    finally:
        shards.stop()
    with pytest.raises(ReplayShardError, match="stopped"):
        shards.replace(shards[1])


def test_a_shard_killed_past_its_restart_cap_is_the_cap_error_and_a_checkpoint_keeps_the_window() -> None:
    def capped_tier() -> ReplayShards:
        return create_replay_actors(
            1,
            capacity=100,
            learning_starts=0,
            replay_batch_size=2,
            seed=0,
            restart_budget=RestartBudget("replay shard", 1, 3600.0),
        )

    shards = capped_tier()
    resources = PlanResources(replay_actors=shards)
    try:
        first = shards[0]
        kill(first)
        second = shards.replace(first, RuntimeError("gone"))  # under the cap: recreated empty, as without one
        ray.get(second.add_batch.remote(rows(2)), timeout=60)
        assert steps_added(second) == 2 and shards.num_restarts == 1
        state = resources.get_state()
        assert len(state["restart_times"]["replay_shards"]) == 1
        kill(second)
        with pytest.raises(
            WorkerFailureError, match=r"replay shard 0 failed .*max_worker_restarts=1, restart_window_s"
        ):
            shards.replace(second, RuntimeError("gone again"))
        assert shards.num_restarts == 1 and shards.restart_budget.exhausted
    finally:
        resources.stop()

    resumed = capped_tier()  # a run resumed from the checkpoint: its one restart still counts
    resources = PlanResources(replay_actors=resumed)
    try:
        resources.set_state(state)
        assert resumed.num_restarts == 1
        kill(resumed[0])
        with pytest.raises(WorkerFailureError, match="max_worker_restarts=1"):
            resumed.replace(resumed[0], RuntimeError("gone"))
    finally:
        resources.stop()


def test_a_shard_whose_replacement_failed_to_start_is_recreated_after_a_short_bounded_wait(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The restart backoff asks for an hour; the tier waits at most MAX_SHARD_RESTART_WAIT_S (4 s), since its
    # callers need a shard in every position at once.
    monkeypatch.setattr("flowrl.actors.restart_budget.restart_delay_s", lambda failed_starts: 3600.0 * failed_starts)
    shards = shard_tier(1)
    try:
        first = shards[0]
        kill(first)
        second = shards.replace(first, ray.exceptions.RayActorError(actor_init_failed=True))
        assert (
            "replay shard 0 failed (RayActorError: The actor experienced an error before finishing this task.); "
            "recreating it empty in 4 s (replay shard restart 1)" in caplog.text
        )
        assert shards.num_restarts == 1 and steps_added(second) == 0
    finally:
        shards.stop()


def test_plan_resources_stats_replace_a_dead_shard_and_state_names_it() -> None:
    shards = shard_tier(2)
    resources = PlanResources(replay_actors=shards)
    try:
        ray.get([shard.add_batch.remote(rows(4)) for shard in shards])
        dead = shards[1]
        kill(dead)
        with pytest.raises(ReplayShardError, match="replay shard 1 died"):
            resources.get_state()
        assert shards.num_restarts == 0  # a checkpoint does not silently hold an empty shard
        assert [s["num_steps_added"] for s in resources.stats()["replay_shards"]] == [4, 0]
        assert resources.fault_counters() == no_faults(num_replay_shard_restarts=1)
        assert len(resources.get_state()["replay_shards"]) == 2
    finally:
        resources.stop()
    assert resources.fault_counters() == no_faults()  # nothing held after stop


def test_without_replay_shards_a_dead_shard_is_an_error() -> None:
    [actor] = shard_tier(1)
    resources = PlanResources(replay_actors=[actor])
    kill(actor)
    with pytest.raises(ReplayShardError, match="replay shard 0 died"):
        resources.stats()
    assert resources.fault_counters() == no_faults()
    store = StoreToReplayBuffer(actors=[actor])
    with pytest.raises(ReplayShardError, match="replay shard 0 died before it could store a batch"):
        for _ in range(100):
            store(rows(2))
            time.sleep(0.05)


def serve_until(replayed: Any, done: Any, timeout_s: float = 60.0) -> list[Any]:
    """The sources of the batches ``replayed`` yields until ``done(sources)`` (or the time is up)."""
    sources: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while not done(sources) and time.monotonic() < deadline:
        source, batch = next(replayed)
        assert batch.count == 2
        sources.append(source)
    return sources


def test_a_replay_gather_goes_on_over_a_killed_shard() -> None:
    shards = shard_tier(2)
    try:
        ray.get([shard.add_batch.remote(rows(4, 10 * i)) for i, shard in enumerate(shards)])
        replayed = Replay(actors=shards, num_async=2).zip_with_source_actor()
        assert set(serve_until(replayed, lambda sources: set(sources) == set(shards))) == set(shards)
        dead, other = shards[0], shards[1]
        kill(dead)
        # Shard 1 keeps serving while shard 0 is recreated; once refilled, it serves again.
        serve_until(replayed, lambda sources: shards.num_restarts > 0 and len(sources) >= 10)
        assert shards.num_restarts == 1 and shards[0] != dead and shards[1] == other
        ray.get(shards[0].add_batch.remote(rows(4)))
        assert serve_until(replayed, lambda sources: shards[0] in sources)[-1] == shards[0]
        assert shards.num_restarts == 1
    finally:
        shards.stop()


def test_a_write_to_a_killed_shard_replaces_it_and_counts_the_lost_batch() -> None:
    shards = shard_tier(1)
    store = StoreToReplayBuffer(actors=shards)
    try:
        dead = shards[0]
        kill(dead)
        sent = 0
        deadline = time.monotonic() + 30
        while shards.num_restarts == 0 and time.monotonic() < deadline:
            store(rows(2))
            sent += 1
            time.sleep(0.01)
        for _ in range(5):  # and writes reach the replacement
            store(rows(2))
            sent += 1
        steps_added(shards[0])  # answered after every write sent to it so far
        time.sleep(0.5)
        store(rows(2))  # settles every finished write: all of those sent to the dead shard
        sent += 1
        assert shards.num_restarts == 1 and store.num_lost_replay_writes >= 1
        # Every write either reached the replacement or is counted lost.
        assert steps_added(shards[0]) // 2 + store.num_lost_replay_writes == sent
        assert shards.num_lost_calls == store.num_lost_replay_writes  # what the result reports
    finally:
        shards.stop()


def test_nan_priorities_raise_in_the_driver_within_seconds() -> None:
    shards = create_replay_actors(1, capacity=64, learning_starts=0, replay_batch_size=4, seed=0, prioritized=True)
    op = UpdatePriorities(actors=shards)
    try:
        shard = shards[0]
        ray.get(shard.add_batch.remote(rows(16)))

        def learned(td_errors: float) -> Learned:
            batch = ray.get(shard.replay.remote())
            indexes = batch["batch_indexes"]
            return Learned(shard, {}, batch.count, {"default_policy": (indexes, np.full(len(indexes), td_errors))})

        op(learned(1.0))
        op(learned(np.nan))
        deadline = time.monotonic() + 5.0
        expected = r"replay shard 0 failed to update priorities: ReplayBufferError: priority nan"
        with pytest.raises(ReplayShardError, match=expected):
            while time.monotonic() < deadline:
                op(learned(1.0))
                time.sleep(0.05)
        assert op.num_dropped_priority_updates == 0
    finally:
        shards.stop()


def test_priorities_for_a_replaced_shard_are_dropped_and_counted() -> None:
    shards = create_replay_actors(1, capacity=64, learning_starts=0, replay_batch_size=4, seed=0, prioritized=True)
    op = UpdatePriorities(actors=shards)
    try:
        dead = shards[0]
        ray.get(dead.add_batch.remote(rows(16)))
        indexes = ray.get(dead.replay.remote())["batch_indexes"]
        kill(dead)
        item = Learned(dead, {}, 4, {"default_policy": (indexes, np.ones(4))})
        assert op(item) is item  # sent before anyone knew: lost when it fails
        deadline = time.monotonic() + 30
        while shards.num_restarts == 0 and time.monotonic() < deadline:
            op(item)  # dropped at once once the shard is known replaced
            time.sleep(0.01)
        op(item)
        assert shards.num_restarts == 1 and op.num_dropped_priority_updates >= 2 and op.pending_updates == 0
    finally:
        shards.stop()


def test_a_shard_whose_replay_raises_is_an_error_not_a_restart() -> None:
    shards = shard_tier(1)
    try:
        error = ShardFailedError("shard 0 failed", shard_index=0, iterator_name="replay_actors", reason="raised")
        error.__cause__ = ValueError("corrupt tree")
        hook = _ReplaceFailedShard(shards)
        with pytest.raises(ReplayShardError, match="replay shard 0 failed to replay: ValueError: corrupt tree"):
            hook(0, shards[0], error)
        assert shards.num_restarts == 0  # a new shard running the same code would raise again
    finally:
        shards.stop()


def test_sampling_may_refill_a_recreated_shard_before_training_resumes() -> None:
    shards = shard_tier(1, learning_starts=30)

    def sample(x: int) -> int:
        LocalIterator.get_metrics().counters[STEPS_SAMPLED_COUNTER] += 10
        return x

    try:
        throttled = LocalIterator(lambda timeout: iter(range(100))).for_each(sample)
        throttled = throttled.transform(ThrottleSampling(training_intensity=1.0, start_after=30, replay_shards=shards))
        assert [next(throttled) for _ in range(4)] == [0, 1, 2, 3]  # up to 40 sampled > 30 allowed
        assert isinstance(next(throttled), NextValueNotReady)
        shards.replace(shards[0])  # the new shard takes 30 steps before it replays: sampling may go on
        assert shards.refill_steps == 30
        assert [next(throttled) for _ in range(3)] == [4, 5, 6]
        assert isinstance(next(throttled), NextValueNotReady)
    finally:
        shards.stop()


@ray.remote(num_cpus=0)
class SlowShard:
    """A replay shard stand-in whose writes take ``delay_s`` each."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.count = 0

    def add_batch(self, batch: SampleBatch) -> None:
        time.sleep(self.delay_s)
        self.count += 1

    def num_added(self) -> int:
        return self.count


def test_writes_in_flight_never_exceed_the_bound() -> None:
    shard = SlowShard.remote(0.05)
    store = StoreToReplayBuffer(actors=[shard], max_in_flight=3)
    try:
        seen = []

        def stored(batch: SampleBatch) -> SampleBatch:
            store(batch)
            seen.append(store.pending_writes)
            return batch

        flow = LocalIterator(lambda timeout: (rows(2) for _ in range(20))).for_each(stored)
        assert len(list(flow)) == 20
        assert max(seen) == 3  # the driver got ahead of the shard, and was held at the bound
        assert ray.get(shard.num_added.remote()) == 20
        # Held at the bound is back-pressure: blocked on output (17 writes waited for one of 0.05 s to finish).
        stats = flow.shared_metrics.get().stage_stats[flow.stage.id]
        assert stats.blocked_s >= 0.5 and stats.wait_s == 0 and stats.blocked_s <= stats.time_s
    finally:
        ray.kill(shard)


def test_a_shard_that_stops_answering_writes_is_an_error_not_a_hang() -> None:
    shard = SlowShard.remote(30.0)
    store = StoreToReplayBuffer(actors=[shard], max_in_flight=1, timeout_s=0.5)
    try:
        store(rows(2))
        expected = r"1 calls to store a batch on replay shard 0 got no answer within 0.5 s"
        with pytest.raises(ReplayShardError, match=expected):
            store(rows(2))
    finally:
        ray.kill(shard)


def test_apex_keeps_training_after_its_replay_shard_is_killed() -> None:
    config = {
        "num_workers": 1,
        "num_cpus_per_worker": 0.25,
        "num_envs_per_worker": 1,
        "rollout_fragment_length": 20,
        "learning_starts": 100,
        "train_batch_size": 16,
        "timesteps_per_iteration": 200,
        "seed": 0,
    }
    trainer = Trainer("apex", "CartPole-v1", config)
    try:
        first = trainer.train()
        assert first["info"]["num_steps_trained"] > 0
        shards = trainer.resources.replay_actors
        dead = shards[0]
        kill(dead)
        trained = first["info"]["num_steps_trained"]
        for _ in range(3):
            result = trainer.train()
        assert result["info"]["num_steps_trained"] > trained  # the recreated shard refilled and replays
        assert shards[0] != dead
        assert result["num_replay_shard_restarts"] == 1
        assert result["info"]["replay_shards"][0]["num_steps_added"] > 0
    finally:
        trainer.stop()
