"""A sampler restoring its envs mid-episode: a snapshot that does not load restarts only that env's episode."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from fakes import snapshot_of_a_vanished_class
from gymnasium import spaces

from flowrl.actors.sampling.vector import VectorSampler

pytestmark = pytest.mark.unit


class CountingEnv(gym.Env):
    """``obs = [t]``; episodes of 50 steps; pickles with its step count (not an EzPickle env)."""

    observation_space = spaces.Box(0.0, 100.0, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self) -> None:
        self.t = 0
        self.resets = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.t = 0
        self.resets += 1
        return np.array([self.t], np.float32), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self.t += 1
        return np.array([self.t], np.float32), 1.0, self.t >= 50, False, {}


class ActsZero:
    action_space = spaces.Discrete(2)
    postprocesses = False

    def compute_actions(self, obs_batch: np.ndarray, **_: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        return np.zeros(len(obs_batch), np.int64), {}

    def postprocess_trajectory(self, batch: Any) -> Any:
        return batch


def make_sampler() -> VectorSampler:
    return VectorSampler([CountingEnv(), CountingEnv()], ActsZero(), fragment_length=4, seed=0)


def test_one_snapshot_that_does_not_load_restarts_only_that_envs_episode(caplog: pytest.LogCaptureFixture) -> None:
    saved = make_sampler()
    saved.sample()
    saved.sample()  # both envs 8 steps into their episodes
    state = saved.get_state()
    assert all(snapshot is not None for snapshot in state["envs"])
    state["envs"][1] = snapshot_of_a_vanished_class()

    restored = make_sampler()
    kept = restored.envs[1]
    fresh = restored.set_state(state)

    assert fresh == [1]  # exactly one env restarted: what the trainer reports in envs_restarted
    assert restored.envs[0].t == 8  # resumed mid-episode
    assert restored.envs[1] is kept and kept.t == 0 and kept.resets == 2
    assert "env 1: its saved state does not load here (ModuleNotFoundError" in caplog.text
    batch = restored.sample()  # sampling goes on from where each env is
    first_obs = {int(env): batch["obs"][batch["env_id"] == env][0, 0] for env in (0, 1)}
    assert first_obs == {0: 8.0, 1: 0.0}
