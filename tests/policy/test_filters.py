"""MeanStdFilter: normalization, merging across workers, state and JSON, and filtered fragments (no Ray)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from flowrl.data import SampleBatch
from flowrl.errors import ConfigError
from flowrl.policy.filters import MeanStdFilter, RunningStats, filter_fragment, make_observation_filter

pytestmark = pytest.mark.unit


def observations(seed: int, n: int, dim: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.normal(loc=[1.0, -2.0, 5.0][:dim], scale=[0.5, 3.0, 0.1][:dim], size=(n, dim)).astype(np.float32)


def test_a_batch_joins_the_statistics_before_it_is_normalized() -> None:
    obs_filter = MeanStdFilter()
    first = observations(0, 50)
    out = obs_filter(first)
    assert out.dtype == np.float32 and out.shape == first.shape
    np.testing.assert_allclose(out, (first - first.mean(axis=0)) / first.std(axis=0), rtol=1e-4, atol=1e-5)
    second = observations(1, 30)
    out = obs_filter(second)
    both = np.concatenate([first, second])
    np.testing.assert_allclose(out, (second - both.mean(axis=0)) / both.std(axis=0), rtol=1e-4, atol=1e-5)
    stats = obs_filter.stats()
    assert stats is not None and stats.count == 80


def test_update_false_leaves_the_statistics_alone_and_no_statistics_is_identity() -> None:
    obs_filter = MeanStdFilter()
    raw = observations(2, 5)
    np.testing.assert_array_equal(obs_filter(raw, update=False), raw)
    assert obs_filter.stats() is None
    obs_filter(raw)
    before = obs_filter.stats()
    obs_filter(observations(3, 5) * 100, update=False)
    after = obs_filter.stats()
    assert before is not None and after is not None
    assert after.count == before.count
    np.testing.assert_array_equal(after.mean, before.mean)


def test_a_constant_component_is_shifted_not_scaled() -> None:
    obs_filter = MeanStdFilter()
    out = obs_filter(np.array([[3.0, 1.0], [3.0, 2.0]]))
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out[:, 0], [0.0, 0.0])


def test_image_shaped_observations_are_filtered_per_pixel() -> None:
    obs_filter = MeanStdFilter()
    frames = np.random.default_rng(0).integers(0, 255, size=(20, 4, 4, 2)).astype(np.uint8)
    out = obs_filter(frames)
    assert out.shape == frames.shape and out.dtype == np.float32
    flat = frames.reshape(20, -1).astype(np.float64)
    np.testing.assert_allclose(out.reshape(20, -1), (flat - flat.mean(0)) / flat.std(0), rtol=1e-4, atol=1e-4)


def test_deltas_merge_into_the_drivers_statistics_and_sync_back() -> None:
    driver, worker_a, worker_b = MeanStdFilter(), MeanStdFilter(), MeanStdFilter()
    a, b = observations(4, 40), observations(5, 25)
    worker_a(a)
    worker_b(b)
    for worker in (worker_a, worker_b):
        driver.apply_delta(worker.pop_delta())
    merged = driver.stats()
    both = np.concatenate([a, b]).astype(np.float64)
    assert merged is not None and merged.count == 65
    np.testing.assert_allclose(merged.mean, both.mean(axis=0))
    np.testing.assert_allclose(merged.var, both.var(axis=0))
    assert worker_a.pop_delta() is None  # handed over once
    # Observations a worker sees between handing its delta over and receiving the merge are kept.
    late = observations(6, 10)
    worker_a(late)
    worker_a.sync(merged)
    synced = worker_a.stats()
    everything = np.concatenate([a, b, late]).astype(np.float64)
    assert synced is not None and synced.count == 75
    np.testing.assert_allclose(synced.mean, everything.mean(axis=0))
    delta = worker_a.pop_delta()
    assert delta is not None and delta.count == 10  # and they reach the driver at the next sync


def test_state_round_trips_with_the_pending_delta() -> None:
    obs_filter = MeanStdFilter()
    obs_filter(observations(7, 12))
    restored = MeanStdFilter()
    restored.set_state(obs_filter.get_state())
    raw = observations(8, 4)
    np.testing.assert_array_equal(restored(raw, update=False), obs_filter(raw, update=False))
    delta = restored.pop_delta()
    assert delta is not None and delta.count == 12


def test_json_carries_the_normalization() -> None:
    obs_filter = MeanStdFilter()
    obs_filter(observations(9, 30))
    described = obs_filter.to_json()
    assert described["type"] == "MeanStdFilter" and described["count"] == 30
    loaded = MeanStdFilter.from_json(described)
    raw = observations(10, 6)
    np.testing.assert_allclose(loaded(raw, update=False), obs_filter(raw, update=False), rtol=1e-6, atol=1e-6)
    assert MeanStdFilter.from_json(MeanStdFilter().to_json()).stats() is None
    with pytest.raises(ValueError):
        MeanStdFilter.from_json({"type": "MeanStdFilter", "count": 3, "mean": [0.0], "std": [1.0, 2.0]})


def test_running_stats_merge_matches_numpy() -> None:
    parts = [observations(seed, n) for seed, n in ((11, 7), (12, 1), (13, 30))]
    merged = RunningStats(3)
    for part in parts:
        merged.merge(RunningStats.of(part))
    both = np.concatenate(parts).astype(np.float64)
    np.testing.assert_allclose(merged.mean, both.mean(axis=0))
    np.testing.assert_allclose(merged.var, both.var(axis=0))


def test_make_observation_filter_names_what_it_cannot_filter() -> None:
    box = gym.spaces.Box(-1, 1, (3,))
    assert make_observation_filter("NoFilter", box) is None
    assert isinstance(make_observation_filter("MeanStdFilter", box), MeanStdFilter)
    with pytest.raises(ConfigError, match="multi-agent"):
        make_observation_filter("MeanStdFilter", box, multi_agent=True)
    with pytest.raises(ConfigError, match="Discrete"):
        make_observation_filter("MeanStdFilter", gym.spaces.Discrete(4))
    with pytest.raises(ConfigError, match="'NoFilter', 'MeanStdFilter'"):
        make_observation_filter("RunningFilter", box)


def test_filter_fragment_uses_the_next_rows_filtered_obs_and_filters_episode_ends() -> None:
    # Two envs, three steps; env 1's episode ends at step 0 (its step-1 obs comes from a reset).
    raw_obs = np.arange(12, dtype=np.float32).reshape(3, 2, 2)
    raw_new = raw_obs + 100
    ends = np.array([[False, True], [False, False], [False, False]])
    columns = {
        SampleBatch.OBS: raw_obs.copy(),
        SampleBatch.NEW_OBS: raw_new.copy(),
        SampleBatch.TERMINATEDS: ends,
        SampleBatch.TRUNCATEDS: np.zeros_like(ends),
    }
    obs_filter = MeanStdFilter()
    filtered = np.stack([obs_filter(row) for row in raw_obs])
    filter_fragment(columns, filtered, obs_filter)
    np.testing.assert_array_equal(columns[SampleBatch.OBS], filtered)
    new = columns[SampleBatch.NEW_OBS]
    np.testing.assert_array_equal(new[0, 0], filtered[1, 0])  # the episode goes on: the next row's obs
    np.testing.assert_array_equal(new[1, 1], filtered[2, 1])
    for step, env in ((0, 1), (2, 0), (2, 1)):  # an episode's end and the last row: filtered, not counted
        np.testing.assert_allclose(new[step, env], obs_filter(raw_new[step, env][None], update=False)[0])
    stats = obs_filter.stats()
    assert stats is not None and stats.count == 6
