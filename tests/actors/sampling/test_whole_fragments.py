"""A policy that postprocesses nothing gets each fragment whole: the same rows as the cut pieces (no Ray)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from fakes import bc_loss
from gymnasium import spaces

from flowrl.actors.sampling.vector import VectorSampler
from flowrl.config import TrainerConfig
from flowrl.data import SampleBatch
from flowrl.policy import Policy, TorchPolicy

pytestmark = pytest.mark.unit


class CountingEnv(gym.Env):
    """``obs = [t, index]``; episodes of ``3 + index`` steps, terminated, except every third one is truncated.

    With ``nan_at`` the observation of that step (counted across episodes) is NaN: a bad
    observation whose episode ``on_bad_observation="drop_episode"`` drops.
    """

    observation_space = spaces.Box(-100.0, 100.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, index: int, nan_at: int | None = None) -> None:
        self.index, self.nan_at = index, nan_at
        self.t = self.steps = self.episodes = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.t, self.index], np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.t = 0
        self.episodes += 1
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict]:
        self.t += 1
        self.steps += 1
        ends = self.t >= 3 + self.index
        truncated = ends and self.episodes % 3 == 0
        obs = self._obs()
        if self.steps == self.nan_at:
            obs[0] = np.nan
        return obs, float(action) + 0.5, ends and not truncated, truncated, {}


def identity(policy: TorchPolicy[Any], batch: SampleBatch) -> SampleBatch:
    return batch


def make_policy(postprocess_fn: Any = None) -> TorchPolicy[Any]:
    config = TrainerConfig.from_dict({"seed": 3}).frozen()
    space = CountingEnv.observation_space
    return TorchPolicy(space, CountingEnv.action_space, config, loss_fn=bc_loss, postprocess_fn=postprocess_fn)


def make_sampler(policy: TorchPolicy[Any], nan_at: int | None = None) -> VectorSampler:
    envs: list[gym.Env] = [CountingEnv(i, nan_at if i == 1 else None) for i in range(3)]
    return VectorSampler(envs, policy, fragment_length=7, seed=0, on_bad_observation="drop_episode")


@pytest.mark.parametrize("nan_at", [None, 9])
def test_whole_fragments_hold_the_rows_of_the_concatenated_pieces(nan_at: int | None) -> None:
    plain, postprocessing = make_policy(), make_policy(identity)
    postprocessing.set_weights(plain.get_weights())  # same weights and action seed: the same actions
    whole = make_sampler(plain, nan_at)  # no postprocessing: the fragment is returned whole
    cut = make_sampler(postprocessing, nan_at)  # a postprocess_fn: cut into pieces and concatenated
    assert not whole.policy.postprocesses and cut.policy.postprocesses
    for _ in range(4):
        a, b = whole.sample(), cut.sample()
        assert list(a.keys()) == list(b.keys())
        for key in a:
            assert a[key].dtype == b[key].dtype, key
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    if nan_at is None:
        assert a.count == 7 * 3
    else:  # the episode with the NaN observation was dropped from both
        assert whole.num_bad_observations == cut.num_bad_observations == 1
    assert [vars(s) for s in whole.pop_episode_stats()] == [vars(s) for s in cut.pop_episode_stats()]


def test_whole_fragments_run_env_by_env_in_time_order() -> None:
    batch = make_sampler(make_policy()).sample()
    env_ids = batch[SampleBatch.ENV_ID]
    np.testing.assert_array_equal(env_ids, np.repeat(np.arange(3), 7))
    for i in range(3):
        rows = env_ids == i
        np.testing.assert_array_equal(batch[SampleBatch.OBS][rows, 1], i)
        # Within an episode each row's next observation is the next row's observation.
        goes_on = ~(batch[SampleBatch.TERMINATEDS][rows] | batch[SampleBatch.TRUNCATEDS][rows])[:-1]
        np.testing.assert_array_equal(
            batch[SampleBatch.NEW_OBS][rows][:-1][goes_on], batch[SampleBatch.OBS][rows][1:][goes_on]
        )


class Postprocessing(TorchPolicy[Any]):
    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        return batch


def test_which_policies_postprocess() -> None:
    assert not make_policy().postprocesses
    assert make_policy(identity).postprocesses
    config = TrainerConfig.from_dict({}).frozen()
    subclass = Postprocessing(CountingEnv.observation_space, CountingEnv.action_space, config, loss_fn=bc_loss)
    assert subclass.postprocesses
    assert Policy.postprocess_trajectory is not TorchPolicy.postprocess_trajectory
