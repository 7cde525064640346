"""Replay operators: storing, replaying from a local buffer, priorities, and sampling throttles."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import pytest

from flowrl.data import LocalReplayBuffer, SampleBatch
from flowrl.errors import FlowRLError
from flowrl.iterators import LocalIterator, NextValueNotReady
from flowrl.operators import STEPS_SAMPLED_COUNTER, STEPS_TRAINED_COUNTER, Concurrently
from flowrl.operators.replay_ops import TD_ERROR, Replay, StoreToReplayBuffer, ThrottleSampling, UpdatePriorities


def batch(n: int, start: int = 0) -> SampleBatch:
    return SampleBatch(obs=np.arange(start, start + n, dtype=np.float32)[:, None], rewards=np.ones(n, np.float32))


def test_store_then_replay_through_a_round_robin_union() -> None:
    buffer = LocalReplayBuffer(capacity=100, learning_starts=8, replay_batch_size=4, prioritized=False, seed=0)
    store = LocalIterator(lambda timeout: (batch(4, 4 * i) for i in range(10))).for_each(StoreToReplayBuffer(local_buffer=buffer))
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


def test_update_priorities_uses_td_errors_and_drops_them_from_the_info() -> None:
    buffer = LocalReplayBuffer(capacity=16, learning_starts=0, replay_batch_size=4, seed=0)
    buffer.add_batch(batch(8))
    replayed = buffer.replay()
    info = {"default_policy": {TD_ERROR: np.full(4, 5.0), "loss": 1.0}}
    out = LocalIterator(lambda timeout: iter([(replayed, info)])).for_each(UpdatePriorities(buffer))
    _, new_info = next(out)
    assert TD_ERROR not in new_info["default_policy"]
    prioritized = buffer.buffers["default_policy"]
    assert np.allclose(prioritized.priorities()[replayed["batch_indexes"]], 5.0 + 1e-6)


def test_throttle_holds_sampling_until_training_catches_up() -> None:
    pulled: list[int] = []

    def source(timeout: float | None) -> Iterator[int]:
        for i in range(100):
            pulled.append(i)
            yield i

    def sample(x: int) -> int:
        LocalIterator.get_metrics().counters[STEPS_SAMPLED_COUNTER] += 10
        return x

    throttled = LocalIterator(source).for_each(sample).transform(ThrottleSampling(training_intensity=2.0, start_after=20))
    items: list[Any] = [next(throttled) for _ in range(5)]
    assert items[:3] == [0, 1, 2] and all(isinstance(x, NextValueNotReady) for x in items[3:])
    assert len(pulled) == 3  # sampled 30 > 20 allowed: nothing more is pulled
    metrics = throttled.shared_metrics.get()
    metrics.counters[STEPS_TRAINED_COUNTER] = 40  # allows pulling while sampled <= 20 + 40 / 2
    assert [next(throttled), next(throttled)] == [3, 4]  # at 30 and 40 sampled
    assert isinstance(next(throttled), NextValueNotReady)  # 50 > 40
