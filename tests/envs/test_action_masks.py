"""Action masks from envs: the built-in MaskedCartPole-v1, the env checkers' legal actions (and their refusal of a
state with none), the split of a masked Dict observation, and the sampler's mask columns (masks in observations
and in infos)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from masked_envs import EmptyMaskAt, MaskedPair

from flowrl.actors import VectorSampler
from flowrl.actors.sampling.checks import ObservationCheck
from flowrl.data import SampleBatch
from flowrl.envs import MaskedCartPole, check_env, check_multi_agent_env
from flowrl.envs.flatten import flatten_observation, model_space
from flowrl.errors import EnvCheckError, EnvError

pytestmark = pytest.mark.unit


class RaisesOnIllegal(MaskedCartPole):
    """MaskedCartPole that raises on an illegal action, as board-game envs do."""

    def step(self, action: Any) -> Any:
        if not self._mask[int(action)]:
            raise ValueError(f"illegal move {action}")
        return super().step(action)


class SecondLegal:
    """A stand-in policy that picks the last legal action (action 0 without a mask)."""

    postprocesses = True

    def __init__(self) -> None:
        self.masks: list[np.ndarray] = []

    def compute_actions(self, obs: np.ndarray, **kwargs: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        mask = kwargs.get("action_mask")
        if mask is None:
            return np.zeros(len(obs), np.int64), {}
        self.masks.append(mask.copy())
        return (mask.shape[1] - 1 - np.argmax(mask[:, ::-1], axis=1)).astype(np.int64), {}

    def postprocess_trajectory(self, batch: Any) -> Any:
        return batch


@pytest.mark.parametrize("mask", ["observation", "info"])
def test_the_env_checker_samples_legal_actions(mask: str) -> None:
    check_env(RaisesOnIllegal({"mask": mask}), num_steps=300)


@pytest.mark.parametrize("mask", ["observation", "info"])
def test_the_multi_agent_checker_samples_legal_actions(mask: str) -> None:
    check_multi_agent_env(MaskedPair(mask, strict=True), num_steps=30)


@pytest.mark.parametrize(("mask", "field"), [("observation", "obs"), ("info", "info")])
def test_the_env_checker_refuses_a_state_with_no_legal_action(mask: str, field: str) -> None:
    expected = (
        rf"{field}\['action_mask'\]=\[0, 0, 0, 0\], which allows no action; .* "
        r"\(the observation before step 3 of check_env\)"
    )
    with pytest.raises(EnvCheckError, match=expected):
        check_env(EmptyMaskAt(mask, at_step=2), num_steps=30)
    check_env(EmptyMaskAt(mask, at_step=2, ends=True), num_steps=30)  # the episode ends there: no fault


@pytest.mark.parametrize(("mask", "field"), [("observation", r"obs\['b'\]"), ("info", r"infos\['b'\]")])
def test_the_multi_agent_checker_refuses_an_acting_agent_with_no_legal_action(mask: str, field: str) -> None:
    expected = (
        rf"{field}\['action_mask'\]=\[0, 0, 0\], which allows no action; .* "
        r"\(agent 'b' acts at step 3 of check_multi_agent_env\)"
    )
    with pytest.raises(EnvCheckError, match=expected):
        check_multi_agent_env(MaskedPair(mask, at_step=2), num_steps=30)
    check_multi_agent_env(MaskedPair(mask, at_step=MaskedPair.LENGTH), num_steps=30)  # at the end: no fault


def test_the_built_in_env_is_registered_and_validates_its_config() -> None:
    env = gym.make("MaskedCartPole-v1", mask="info")
    assert isinstance(env.unwrapped, MaskedCartPole) and env.unwrapped.mask_place == "info"
    with pytest.raises(EnvError, match="MaskedCartPole-v1 takes env_config"):
        MaskedCartPole({"mask": "nowhere"})


def test_a_masked_dict_is_split_before_flattening() -> None:
    space = MaskedCartPole().observation_space
    assert model_space(space) == space["observations"]
    check = ObservationCheck(space)
    assert check.shape == (4,) and check.flatten is not None
    obs = {"observations": np.arange(4, dtype=np.float32) / 10, "action_mask": np.array([1, 1, 0, 0], np.int8)}
    np.testing.assert_array_equal(check.flatten(obs), obs["observations"])
    np.testing.assert_array_equal(flatten_observation(space, obs), obs["observations"])
    extra = gym.spaces.Dict(
        {"observations": gym.spaces.Box(0, 1), "action_mask": gym.spaces.MultiBinary(2), "x": gym.spaces.Discrete(2)}
    )
    with pytest.raises(
        EnvError, match=r"exactly the keys 'observations' .* got the keys \['action_mask', 'observations', 'x'\]"
    ):
        model_space(extra)


@pytest.mark.parametrize("mask", ["observation", "info"])
def test_the_sampler_acts_with_each_envs_mask_and_stores_both_columns(mask: str) -> None:
    envs = [MaskedCartPole({"mask": mask}) for _ in range(3)]
    policy = SecondLegal()
    batch = VectorSampler(envs, policy, fragment_length=40, seed=0).sample()
    assert sum(env.illegal_actions for env in envs) == 0
    assert len(policy.masks) == 40
    legal, next_legal = batch[SampleBatch.ACTION_MASK], batch[SampleBatch.NEXT_ACTION_MASK]
    assert legal.shape == (120, 4) and legal.dtype == bool
    assert legal[np.arange(120), batch[SampleBatch.ACTIONS]].all()
    assert (legal.sum(1) == 2).all() and (next_legal.sum(1) == 2).all()
    # Within an episode, a row's next mask is the next row's mask.
    same_episode = batch[SampleBatch.EPS_ID][1:] == batch[SampleBatch.EPS_ID][:-1]
    np.testing.assert_array_equal(next_legal[:-1][same_episode], legal[1:][same_episode])
    assert batch[SampleBatch.OBS].shape == (120, 4)


def test_a_mask_under_another_key_is_no_mask() -> None:
    envs = [MaskedCartPole({"mask": "hidden"}) for _ in range(3)]
    batch = VectorSampler(envs, SecondLegal(), fragment_length=40, seed=0).sample()
    assert SampleBatch.ACTION_MASK not in batch
    assert batch[SampleBatch.OBS].shape == (120, 8)  # the mask flattened into the features
    assert sum(env.illegal_actions for env in envs) > 0  # action 0 is illegal half of the time


def test_a_mask_of_the_wrong_length_is_named() -> None:
    class ShortMask(MaskedCartPole):
        def _observe(self, obs: np.ndarray, info: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
            observed, info = super()._observe(obs, info)
            return {**observed, "action_mask": observed["action_mask"][:3]}, info

    with pytest.raises(EnvError, match=r"worker 0, env 0: action_mask=array\(\[.*must hold one 0/1 number per action"):
        VectorSampler([ShortMask()], SecondLegal(), fragment_length=5, seed=0)
