"""The vector sampler carries a recurrent policy's state: reset at every episode start (also after an env
restart or a dropped episode), carried across fragments, recorded per sequence with ``seq_lens`` (no Ray)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from flowrl.actors.sampling.vector import VectorSampler
from flowrl.data import SampleBatch, concat_samples

pytestmark = pytest.mark.unit

EPISODE_LENGTH = 5


class CountingEnv(gym.Env):
    """``obs = [t]``, reward 1, episodes of ``EPISODE_LENGTH`` steps; ``step`` raises or returns NaN at the
    ``fault_at``-th call of this instance (``fault``: ``"raise"`` or ``"nan"``)."""

    observation_space = spaces.Box(-100.0, 100.0, (1,), np.float32)
    action_space = spaces.Discrete(3)

    def __init__(self, fault: str | None = None, fault_at: int = 0) -> None:
        self.fault, self.fault_at, self.steps, self.t = fault, fault_at, 0, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict]:
        self.steps += 1
        self.t += 1
        obs = np.array([self.t], np.float32)
        if self.steps == self.fault_at and self.fault == "raise":
            raise RuntimeError("step boom")
        if self.steps == self.fault_at and self.fault == "nan":
            obs[0] = np.nan
        return obs, 1.0, self.t >= EPISODE_LENGTH, False, {}


class CountingPolicy:
    """A recurrent stand-in whose state counts the steps it acted since the state was reset; acts ``t % 3``."""

    postprocesses = True
    max_seq_len = 3

    def get_initial_state(self) -> list[np.ndarray]:
        return [np.zeros(1, np.float32)]

    def compute_actions(
        self, obs: np.ndarray, *, state: list[np.ndarray] | None = None, **_: Any
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        assert state is not None, "a recurrent policy is given its state"
        return obs[:, 0].astype(np.int64) % 3, {f"{SampleBatch.STATE_OUT}0": state[0] + 1}

    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        return batch


def sample(envs: list[CountingEnv], fragments: int, **kwargs: Any) -> SampleBatch:
    sampler = VectorSampler(envs, CountingPolicy(), fragment_length=7, seed=0, **kwargs)  # type: ignore[arg-type]
    return concat_samples([sampler.sample() for _ in range(fragments)])


def assert_state_reset_at_episode_starts(batch: SampleBatch) -> None:
    """Each sequence starts from a state that counted exactly the steps of its episode so far (0 at a start),
    holds consecutive steps of one episode, and is at most ``max_seq_len`` long; previous rewards and actions
    are those of the step before (zeros at an episode's start)."""
    seq_lens, bounds = batch[SampleBatch.SEQ_LENS], batch.sequence_bounds()
    assert len(seq_lens) == len(batch[f"{SampleBatch.STATE_IN}0"]) and (seq_lens <= 3).all()
    assert f"{SampleBatch.STATE_OUT}0" not in batch
    t, obs = batch[SampleBatch.T], batch[SampleBatch.OBS][:, 0]
    np.testing.assert_array_equal(batch[f"{SampleBatch.STATE_IN}0"][:, 0], t[bounds[:-1]])
    np.testing.assert_array_equal(obs, t)
    np.testing.assert_array_equal(batch[SampleBatch.PREV_REWARDS], (t > 0).astype(np.float32))
    np.testing.assert_array_equal(batch[SampleBatch.PREV_ACTIONS], np.where(t > 0, (t - 1) % 3, 0))
    for start, stop in zip(bounds[:-1], bounds[1:]):
        assert len(set(batch[SampleBatch.EPS_ID][start:stop].tolist())) == 1
        np.testing.assert_array_equal(np.diff(t[start:stop]), 1)


def test_the_state_is_reset_at_every_episode_start_inside_and_across_fragments() -> None:
    batch = sample([CountingEnv(), CountingEnv()], fragments=4)
    assert batch.count == 4 * 7 * 2
    starts = batch[SampleBatch.T][batch.sequence_bounds()[:-1]]
    assert (starts == 0).sum() >= 8 and (starts > 0).any()  # episodes start inside fragments, and run across them
    assert_state_reset_at_episode_starts(batch)


def test_the_state_is_reset_after_an_env_restart() -> None:
    envs = [CountingEnv(), CountingEnv("raise", fault_at=3)]
    batch = sample(envs, fragments=3, env_maker=lambda index: CountingEnv())
    assert (batch[SampleBatch.ENV_ID] == 1).sum() < 3 * 7  # the failed episode's rows are dropped
    assert_state_reset_at_episode_starts(batch)


def test_the_state_is_reset_after_a_dropped_episode() -> None:
    envs = [CountingEnv(), CountingEnv("nan", fault_at=8)]
    batch = sample(envs, fragments=3, on_bad_observation="drop_episode")
    assert_state_reset_at_episode_starts(batch)


def test_sampler_state_saves_and_restores_the_recurrent_state() -> None:
    envs = [CountingEnv(), CountingEnv()]
    sampler = VectorSampler(envs, CountingPolicy(), fragment_length=7, seed=0)  # type: ignore[arg-type]
    sampler.sample()
    saved = sampler.get_state()
    expected = sampler.sample()
    sampler.set_state(saved)
    again = sampler.sample()
    for key in expected:
        np.testing.assert_array_equal(again[key], expected[key])
