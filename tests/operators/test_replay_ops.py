"""Replay operators: storing, replaying from a local buffer, priorities, and sampling throttles."""

from __future__ import annotations

import time
from typing import Any, Iterator

import numpy as np
import pytest
import ray
from fakes import from_list

from flowrl.actors import Learned, LearnerInfo, ReplayActor
from flowrl.data import LocalReplayBuffer, SampleBatch
from flowrl.errors import FlowRLError
from flowrl.iterators import LocalIterator, NextValueNotReady
from flowrl.operators import STEPS_SAMPLED_COUNTER, STEPS_TRAINED_COUNTER, Concurrently, MixInReplay, Trained
from flowrl.operators.replay_ops import Replay, StoreToReplayBuffer, ThrottleSampling, UpdatePriorities

pytestmark = pytest.mark.unit


def batch(n: int, start: int = 0) -> SampleBatch:
    return SampleBatch(obs=np.arange(start, start + n, dtype=np.float32)[:, None], rewards=np.ones(n, np.float32))


def test_store_then_replay_through_a_round_robin_union() -> None:
    buffer = LocalReplayBuffer(capacity=100, learning_starts=8, replay_batch_size=4, prioritized=False, seed=0)
    store = LocalIterator(lambda timeout: (batch(4, 4 * i) for i in range(10))).for_each(
        StoreToReplayBuffer(local_buffer=buffer)
    )
    flow = Concurrently([store, Replay(local_buffer=buffer)], mode="round_robin", output_indexes=[1])
    replayed = flow.take(5)
    assert all(b.count == 4 for b in replayed)
    assert buffer.num_steps_added >= 8  # nothing was replayed before learning_starts steps were stored


def test_replay_alone_before_learning_starts_raises() -> None:
    buffer = LocalReplayBuffer(capacity=10, learning_starts=5, replay_batch_size=2)
    with pytest.raises(FlowRLError, match="learning_starts"):
        next(Replay(local_buffer=buffer))
    with pytest.raises(FlowRLError):
        Replay()


def test_update_priorities_uses_td_errors_and_keeps_them_out_of_the_info() -> None:
    buffer = LocalReplayBuffer(capacity=16, learning_starts=0, replay_batch_size=4, seed=0)
    buffer.add_batch(batch(8))
    replayed = buffer.replay()
    priorities = {"default_policy": (replayed["batch_indexes"], np.full(4, 5.0))}
    trained = Trained(replayed, LearnerInfo({"default_policy": {"loss": 1.0}}, priorities))
    out = from_list([trained]).for_each(UpdatePriorities(local_buffer=buffer))
    new_info = next(out).info
    assert "td_error" not in new_info["default_policy"] and new_info == {"default_policy": {"loss": 1.0}}
    prioritized = buffer.buffers["default_policy"]
    assert np.allclose(prioritized.priorities()[replayed["batch_indexes"]], 5.0 + 1e-6)


@pytest.mark.usefixtures("ray_session")
def test_update_priorities_sends_a_learners_priorities_to_the_shard_the_batch_came_from() -> None:
    shard, other = (ReplayActor.remote(capacity=16, learning_starts=0, replay_batch_size=4, seed=0) for _ in range(2))
    try:
        ray.get([shard.add_batch.remote(batch(8)), other.add_batch.remote(batch(8))])
        indexes = ray.get(shard.replay.remote())["batch_indexes"]
        priorities = {"default_policy": (indexes, np.full(4, 5.0))}
        items = [Learned(shard, {"default_policy": {"loss": 1.0}}, 4, priorities), Learned(other, {}, 4)]
        op = UpdatePriorities(actors=[shard, other])
        out = from_list(items).for_each(op)
        assert [next(out), next(out)] == items  # pass-through
        stats = ray.get([shard.stats.remote(), other.stats.remote()])
        max_priority = [s["policies"]["default_policy"]["max_priority"] for s in stats]
        assert max_priority == [pytest.approx(5.0 + 1e-6), 1.0]  # nothing sent for a batch without TD errors
        assert op.num_dropped_priority_updates == 0
        with pytest.raises(FlowRLError, match="source is a replay shard"):
            op(Trained(batch(3), LearnerInfo({}, priorities)))
    finally:
        ray.kill(shard)
        ray.kill(other)


def test_throttle_holds_sampling_until_training_catches_up() -> None:
    pulled: list[int] = []

    def source(timeout: float | None) -> Iterator[int]:
        for i in range(100):
            pulled.append(i)
            yield i

    def sample(x: int) -> int:
        LocalIterator.get_metrics().counters[STEPS_SAMPLED_COUNTER] += 10
        return x

    throttled = (
        LocalIterator(source).for_each(sample).transform(ThrottleSampling(training_intensity=2.0, start_after=20))
    )
    items: list[Any] = [next(throttled) for _ in range(5)]
    assert items[:3] == [0, 1, 2] and all(isinstance(x, NextValueNotReady) for x in items[3:])
    assert len(pulled) == 3  # sampled 30 > 20 allowed: nothing more is pulled
    metrics = throttled.shared_metrics.get()
    assert metrics.stage_stats[throttled.stage.id].held_s == 0
    time.sleep(0.02)
    metrics.counters[STEPS_TRAINED_COUNTER] = 40  # allows pulling while sampled <= 20 + 40 / 2
    assert [next(throttled), next(throttled)] == [3, 4]  # at 30 and 40 sampled
    assert isinstance(next(throttled), NextValueNotReady)  # 50 > 40
    assert metrics.stage_stats[throttled.stage.id].held_s >= 0.02  # sampling held back: back-pressure


# --- MixInReplay ---


def numbered(i: int) -> SampleBatch:
    return SampleBatch({SampleBatch.OBS: np.full((2, 1), i, np.float32)})


def test_mix_in_replay_passes_fresh_batches_first_and_replays_only_older_ones() -> None:
    op = MixInReplay(num_slots=3, replay_proportion=2.0, seed=0)
    assert [int(b[SampleBatch.OBS][0, 0]) for b in op(numbered(0))] == [0]  # nothing to replay yet
    for i in range(1, 10):
        out = op(numbered(i))
        ids = [int(b[SampleBatch.OBS][0, 0]) for b in out]
        assert ids[0] == i and len(ids) == 3
        # Only the last num_slots batches before this one can come back.
        assert all(max(0, i - 3) <= j < i for j in ids[1:])


def test_mix_in_replay_averages_replay_proportion_replays_per_batch() -> None:
    op = MixInReplay(num_slots=10, replay_proportion=0.5, seed=1)
    op(numbered(0))
    replays = [len(op(numbered(i))) - 1 for i in range(1, 2001)]
    assert set(replays) == {0, 1}
    assert np.mean(replays) == pytest.approx(0.5, abs=0.05)
    assert [len(MixInReplay(5, 0.0)(numbered(i))) for i in range(5)] == [1] * 5


def test_mix_in_replay_state_round_trip_repeats_its_draws() -> None:
    a = MixInReplay(num_slots=4, replay_proportion=1.5, seed=3)
    for i in range(4):
        a(numbered(i))
    b = MixInReplay(num_slots=4, replay_proportion=1.5)
    b.slots, b.next_slot = list(a.slots), a.next_slot
    b.set_state(a.get_state())
    for i in range(4, 8):
        assert [x[SampleBatch.OBS][0, 0] for x in a(numbered(i))] == [x[SampleBatch.OBS][0, 0] for x in b(numbered(i))]


def test_mix_in_replay_rejects_bad_settings() -> None:
    with pytest.raises(FlowRLError, match="num_slots=0"):
        MixInReplay(0, 0.5)
    with pytest.raises(FlowRLError, match="replay_proportion=-1"):
        MixInReplay(4, -1)
