"""Dict and Tuple observation spaces: checked, flattened by the samplers for the built-in models,
saved and restored, loaded for inference, and learnable (PPO on CartPole split into a Dict)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import ray.cloudpickle
from fakes import train_to_reward
from gymnasium import spaces

import flowrl
from flowrl import Trainer
from flowrl.actors import VectorSampler
from flowrl.actors.sampling.checks import ObservationCheck
from flowrl.data import SampleBatch
from flowrl.envs import CooperativeMatching, check_env, check_multi_agent_env
from flowrl.errors import BadObservationError

pytestmark = [pytest.mark.unit, pytest.mark.timeout(300)]

# Ray's workers cannot import this module: the env classes below travel to them by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class DictCartPole(gym.ObservationWrapper[Any, int, np.ndarray]):
    """CartPole-v1 observing ``{"cart": [x, x_dot], "pole": [theta, theta_dot]}``."""

    def __init__(self, env_config: dict[str, Any] | None = None) -> None:
        super().__init__(gym.make("CartPole-v1"))
        box = self.env.observation_space
        assert isinstance(box, spaces.Box)
        self.observation_space = spaces.Dict(
            {"cart": spaces.Box(box.low[:2], box.high[:2]), "pole": spaces.Box(box.low[2:], box.high[2:])}
        )

    def observation(self, obs: np.ndarray) -> dict[str, np.ndarray]:
        return {"cart": obs[:2], "pole": obs[2:]}


class TupleCartPole(gym.ObservationWrapper[Any, int, np.ndarray]):
    """CartPole-v1 observing ``([x, x_dot], [theta, theta_dot])``."""

    def __init__(self, env_config: dict[str, Any] | None = None) -> None:
        super().__init__(gym.make("CartPole-v1"))
        box = self.env.observation_space
        assert isinstance(box, spaces.Box)
        self.observation_space = spaces.Tuple(
            (spaces.Box(box.low[:2], box.high[:2]), spaces.Box(box.low[2:], box.high[2:]))
        )

    def observation(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return obs[:2], obs[2:]


class LosesThePole(DictCartPole):
    """From its third step on, observes a dict without the ``"pole"`` key."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self.t = 0
        return super().reset(**kwargs)

    def observation(self, obs: np.ndarray) -> dict[str, np.ndarray]:
        self.t = getattr(self, "t", 0) + 1
        return {"cart": obs[:2]} if self.t > 3 else super().observation(obs)


class DictCues(CooperativeMatching):
    """CooperativeMatching whose agents observe ``{"cue": one-hot}``."""

    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Dict({"cue": super().observation_space(agent)})

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        obs, infos = super().reset(seed=seed, options=options)
        return {agent: {"cue": o} for agent, o in obs.items()}, infos

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        obs, *rest = super().step(actions)
        return ({agent: {"cue": o} for agent, o in obs.items()}, *rest)  # type: ignore[return-value]


class FirstAction:
    """A stand-in policy: always action 0."""

    postprocesses = True  # the sampler cuts its fragments into pieces, as for a postprocessing policy

    def compute_actions(self, obs: np.ndarray, **_: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        return np.zeros(len(obs), np.int64), {}

    def postprocess_trajectory(self, batch: Any) -> Any:
        return batch


def test_env_checkers_accept_dict_and_tuple_observations() -> None:
    for env in (DictCartPole(), TupleCartPole()):
        check_env(env)
    check_multi_agent_env(DictCues())


def test_observation_check_flattens_and_names_what_does_not_fit() -> None:
    space = DictCartPole().observation_space
    check = ObservationCheck(space)
    assert check.flatten is not None and check.shape == (4,)
    flat = check.flatten({"pole": np.array([0.25, 4.0], np.float32), "cart": np.array([1.0, 2.0], np.float32)})
    np.testing.assert_array_equal(flat, [1.0, 2.0, 0.25, 4.0])  # the space's key order, not the dict's
    assert check.problem(flat, "obs") is None
    missing = check.flatten({"cart": np.zeros(2, np.float32)})
    assert "obs={'cart': " in (check.problem(missing, "obs") or "")
    assert "which does not fit observation_space Dict('cart'" in (check.problem(missing, "obs") or "")
    out_of_bounds = check.flatten({"cart": np.array([9.0, 0.0], np.float32), "pole": np.zeros(2, np.float32)})
    assert "obs[0]=9.0 above flatten_space(observation_space).high[0]=4.8" in (
        check.problem(out_of_bounds, "obs") or ""
    )


def test_sampler_stores_dict_observations_flattened_and_reports_a_broken_one() -> None:
    env = DictCartPole()
    sampler = VectorSampler([env], FirstAction(), fragment_length=5, seed=0)
    batch = sampler.sample()
    assert batch[SampleBatch.OBS].shape == (5, 4) and batch[SampleBatch.OBS].dtype == np.float32
    np.testing.assert_array_equal(batch[SampleBatch.OBS][1:], batch[SampleBatch.NEW_OBS][:-1])
    broken = VectorSampler([LosesThePole()], FirstAction(), fragment_length=5, seed=0)
    with pytest.raises(
        BadObservationError, match=r"worker 0, env 0: env.step\(\) at step 2 of its episode .*new_obs=\{'cart'"
    ):
        broken.sample()


def test_a_tuple_env_samples_saves_restores_and_loads_for_inference(ray_session: None, tmp_path: Path) -> None:
    config = {
        "num_workers": 0,
        "rollout_fragment_length": 100,
        "train_batch_size": 100,
        "sgd_minibatch_size": 50,
        "num_sgd_iter": 1,
        "seed": 0,
    }
    trainer = Trainer("ppo", TupleCartPole, config)
    try:
        first = trainer.train()
        assert first["timesteps_total"] == 100
        path = trainer.save(tmp_path)
        expected = trainer.train()
    finally:
        trainer.stop()
    restored = Trainer.from_checkpoint(path)
    try:
        again = restored.train()
    finally:
        restored.stop()
    assert (
        again["episode_reward_mean"] == expected["episode_reward_mean"]
    )  # exact resume, episodes in progress included
    policy = flowrl.load_policy(path)
    assert policy.observation_space == TupleCartPole().observation_space
    obs = TupleCartPole().reset(seed=1)[0]
    assert policy.compute_action(obs) in (0, 1)
    assert policy.compute_actions([obs, obs]).shape == (2,)


def test_multi_agent_dict_observations_train(ray_session: None) -> None:
    trainer = Trainer(
        "ppo",
        DictCues,
        {
            "num_workers": 0,
            "rollout_fragment_length": 50,
            "train_batch_size": 100,
            "sgd_minibatch_size": 50,
            "num_sgd_iter": 1,
            "seed": 0,
        },
    )
    try:
        result = trainer.train()
        policy = trainer.workers.local_worker().get_policy()
    finally:
        trainer.stop()
    assert result["episodes_this_iter"] == 10  # 100 env steps of 10-step episodes
    assert isinstance(policy.observation_space, spaces.Dict)


@pytest.mark.learning
@pytest.mark.timeout(600)
def test_ppo_learns_cartpole_observed_as_a_dict(ray_session: None) -> None:
    trainer = Trainer(
        "ppo",
        DictCartPole,
        {
            "num_workers": 0,
            "num_envs_per_worker": 4,
            "rollout_fragment_length": 250,
            "train_batch_size": 1000,
            "sgd_minibatch_size": 128,
            "num_sgd_iter": 10,
            "lr": 1e-3,
            "seed": 0,
        },
    )
    train_to_reward(trainer, 150, 60_000)
