"""Custom models: checked up front, built for each algorithm family, saved and loaded by their import
path, given Dict observations as dicts when asked, and able to learn CartPole with PPO."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import ray.cloudpickle
import torch
from fakes import train_to_reward
from gymnasium.spaces.utils import flatdim
from torch import nn

import flowrl
from flowrl import Trainer
from flowrl.algorithms import get_algorithm
from flowrl.config import TrainerConfig
from flowrl.engine.build import policy_specs
from flowrl.envs import get_env_creator
from flowrl.errors import ConfigError
from flowrl.policy import TorchPolicy

pytestmark = [pytest.mark.unit, pytest.mark.timeout(300)]

# Ray's workers cannot import this module: the model classes travel to them by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

CARTPOLE_OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
CARTPOLE_ACT = gym.spaces.Discrete(2)


class TinyActorCritic(nn.Module):
    """The actor-critic interface: ``forward(obs) -> (logits [B, num_outputs], values [B])``; separate
    policy and value networks."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, num_outputs: int, hidden: int = 32) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(flatdim(obs_space), hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh()
        )
        self.logits = nn.Linear(hidden, num_outputs)
        self.value = nn.Sequential(
            nn.Linear(flatdim(obs_space), hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1)
        )

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.logits(self.body(obs)), self.value(obs).squeeze(-1)


class LogitsOnly(TinyActorCritic):
    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return self.logits(self.body(obs)), None


class WrongWidth(TinyActorCritic):
    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits, values = super().forward(obs)
        return logits[:, :1], values


class NoForward(nn.Module):
    def __init__(self, obs_space: gym.Space, action_space: gym.Space, num_outputs: int) -> None:
        super().__init__()


class TinyActorAndCritics(nn.Module):
    """The deterministic actor-critic interface (DDPG, TD3): ``actor`` and ``critics``."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, num_outputs: int, twin: bool = False) -> None:
        super().__init__()
        obs_dim, act_dim = flatdim(obs_space), flatdim(action_space)
        self.actor = nn.Sequential(nn.Linear(obs_dim, 16), nn.ReLU(), nn.Linear(16, act_dim))
        self.critics = nn.ModuleList(nn.Linear(obs_dim + act_dim, 1) for _ in range(2 if twin else 1))


def build(algo: str, env: str, model: dict[str, Any]) -> Any:
    algorithm = get_algorithm(algo)
    config = algorithm.config_class.from_dict({"num_workers": 0, "seed": 0, "model": model}).frozen()
    [spec] = policy_specs(algorithm, config, get_env_creator(env)).values()
    return spec.build()


# --- checked up front -----------------------------------------------------------------------------


def test_config_names_a_custom_model_that_cannot_be_used() -> None:
    for model, expected in [
        ({"custom_model": "no_such_module:Net"}, "model.custom_model='no_such_module:Net': cannot import"),
        ({"custom_model": "flowrl.config:TrainerConfig"}, "TrainerConfig is not a subclass of torch.nn.Module"),
        ({"custom_model": TinyActorCritic, "custom_model_config": {"hiden": 8}}, "unexpected keyword argument 'hiden'"),
        ({"custom_model_config": {"hidden": 8}}, "custom_model is None"),
        ({"custom_model": TinyActorCritic, "custom_model_obs": "nested"}, "custom_model_obs='nested' is not one of"),
    ]:
        with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")):
            TrainerConfig.from_dict({"model": model})


@pytest.mark.parametrize(
    ("model_class", "expected"),
    [
        (
            LogitsOnly,
            r"'LogitsOnly' does not implement the actor-critic interface .*its values are a NoneType, not \[2\]",
        ),
        (WrongWidth, r"its first output is a tensor of shape \[2, 1\], not \[2, 2\]"),
        (NoForward, r"'NoForward' does not implement .*forward raised NotImplementedError"),
    ],
)
def test_a_model_that_does_not_fit_its_interface_is_a_config_error(model_class: type, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        build("ppo", "CartPole-v1", {"custom_model": model_class})


def test_each_family_takes_its_interface() -> None:
    ppo = build("ppo", "CartPole-v1", {"custom_model": TinyActorCritic, "custom_model_config": {"hidden": 8}})
    assert isinstance(ppo.model, TinyActorCritic) and ppo.model.logits.in_features == 8
    actions, extra = ppo.compute_actions(np.zeros((3, 4), np.float32))
    assert actions.shape == (3,) and extra["vf_preds"].shape == (3,)
    # PG and DQN need no values: (logits or Q-values, None) fits them.
    assert isinstance(build("pg", "CartPole-v1", {"custom_model": LogitsOnly}).model, LogitsOnly)
    dqn = build("dqn", "CartPole-v1", {"custom_model": LogitsOnly})
    assert isinstance(dqn.model, LogitsOnly) and isinstance(dqn.target_model, LogitsOnly)
    td3 = build("td3", "Pendulum-v1", {"custom_model": TinyActorAndCritics, "custom_model_config": {"twin": True}})
    assert td3.model.actor[0].in_features == 3 and len(td3.model.critics) == 2
    assert td3.compute_single_action(np.zeros(3, np.float32)).shape == (1,)
    with pytest.raises(ConfigError, match="critics of 2"):
        build("td3", "Pendulum-v1", {"custom_model": TinyActorAndCritics})
    with pytest.raises(ConfigError, match="builds its own model and takes no custom model"):
        build("es", "CartPole-v1", {"custom_model": TinyActorCritic})


class SeesTheDict(nn.Module):
    """Asks for Dict observations as dicts of tensors (``custom_model_obs: structured``)."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, num_outputs: int) -> None:
        super().__init__()
        self.seen: list[dict[str, tuple[int, ...]]] = []
        self.net = nn.Linear(3 + 2, num_outputs + 1)

    def forward(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        self.seen.append({key: tuple(value.shape) for key, value in obs.items()})
        out = self.net(torch.cat([obs["position"].flatten(1), obs["mode"]], dim=1))
        return out[:, :-1], out[:, -1]


def test_structured_observations_reach_the_model_as_a_dict_of_tensors() -> None:
    space = gym.spaces.Dict({"position": gym.spaces.Box(-1, 1, (3, 1), np.float32), "mode": gym.spaces.Discrete(2)})
    algorithm = get_algorithm("ppo")
    config = algorithm.config_class.from_dict(
        {"num_workers": 0, "model": {"custom_model": SeesTheDict, "custom_model_obs": "structured"}}
    ).frozen()
    policy = algorithm.make_policy(space, CARTPOLE_ACT, config).build()
    assert isinstance(policy, TorchPolicy)
    policy.model.seen.clear()
    action = policy.compute_single_action({"mode": 1, "position": np.zeros((3, 1), np.float32)})
    assert action in (0, 1)
    # Dict keys in the space's (sorted) order; the Discrete part one-hot.
    assert policy.model.seen == [{"mode": (1, 2), "position": (1, 3, 1)}]
    with pytest.raises(ConfigError, match="needs a Dict or Tuple observation space"):
        algorithm.make_policy(CARTPOLE_OBS, CARTPOLE_ACT, config).build()


# --- checkpoints and load_policy ------------------------------------------------------------------


MODEL_MODULE = """
import torch
from torch import nn
from gymnasium.spaces.utils import flatdim


class Net(nn.Module):
    def __init__(self, obs_space, action_space, num_outputs, hidden=16):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(flatdim(obs_space), hidden), nn.Tanh())
        self.heads = nn.Linear(hidden, num_outputs + 1)

    def forward(self, obs):
        out = self.heads(self.body(obs))
        return out[:, :-1], out[:, -1]
"""


def test_checkpoints_record_the_import_path_and_load_policy_rebuilds_the_model(
    ray_session: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_models.py").write_text(textwrap.dedent(MODEL_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    model = {"custom_model": "my_models:Net", "custom_model_config": {"hidden": 8}}
    trainer = Trainer(
        "ppo",
        "CartPole-v1",
        {
            "num_workers": 0,
            "train_batch_size": 200,
            "sgd_minibatch_size": 50,
            "num_sgd_iter": 1,
            "rollout_fragment_length": 200,
            "seed": 0,
            "model": model,
        },
    )
    try:
        trainer.train()
        path = trainer.save(tmp_path / "checkpoints")
        policy = trainer.workers.local_worker().get_policy()
        obs = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
        expected, _ = policy.compute_actions(obs, explore=False)
    finally:
        trainer.stop()
    loaded = flowrl.load_policy(path, allow_imports=["my_models"])
    assert isinstance(loaded.policy, TorchPolicy) and type(loaded.policy.model).__name__ == "Net"
    np.testing.assert_array_equal(loaded.compute_actions(obs), expected)
    restored = Trainer.from_checkpoint(path)
    try:
        np.testing.assert_array_equal(
            restored.workers.local_worker().get_policy().compute_actions(obs, explore=False)[0], expected
        )
    finally:
        restored.stop()


# --- learning -------------------------------------------------------------------------------------


@pytest.mark.learning
@pytest.mark.timeout(600)
def test_ppo_with_a_custom_model_learns_cartpole(ray_session: None) -> None:
    trainer = Trainer(
        "ppo",
        "CartPole-v1",
        {
            "num_workers": 0,
            "num_envs_per_worker": 4,
            "rollout_fragment_length": 250,
            "train_batch_size": 1000,
            "sgd_minibatch_size": 128,
            "num_sgd_iter": 10,
            "lr": 1e-3,
            "seed": 0,
            "model": {"custom_model": TinyActorCritic, "custom_model_config": {"hidden": 64}},
        },
    )
    train_to_reward(trainer, 150, 60_000)
