"""DDPG/TD3's critic loss options (RLlib's use_huber, huber_threshold, l2_reg) and their exploration choices."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from flowrl.algorithms import get_algorithm
from flowrl.algorithms.ddpg import ddpg_loss
from flowrl.data import SampleBatch
from flowrl.errors import ConfigError
from flowrl.policy.exploration import GaussianNoise, OrnsteinUhlenbeckNoise
from flowrl.policy.postprocessing import DISCOUNTS

pytestmark = pytest.mark.unit

ENV = gym.make("Pendulum-v1")


def policy_of(weights_of: Any = None, **config: Any) -> Any:
    """A small DDPG policy; with the weights of ``weights_of`` (another policy) if given."""
    algorithm = get_algorithm("ddpg")
    cfg = algorithm.config_class.from_dict({"seed": 0, "actor_hiddens": [8], "critic_hiddens": [8], **config})
    policy = algorithm.make_policy(ENV.observation_space, ENV.action_space, cfg).build()
    if weights_of is not None:
        policy.set_state(weights_of.get_state())  # its weights and its target network's
    return policy


def batch(n: int = 32) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(0)
    return {
        SampleBatch.OBS: torch.as_tensor(rng.normal(size=(n, 3)), dtype=torch.float32),
        SampleBatch.NEW_OBS: torch.as_tensor(rng.normal(size=(n, 3)), dtype=torch.float32),
        SampleBatch.ACTIONS: torch.as_tensor(rng.uniform(-2, 2, size=(n, 1)), dtype=torch.float32),
        SampleBatch.REWARDS: torch.as_tensor(rng.normal(scale=5.0, size=n), dtype=torch.float32),
        SampleBatch.TERMINATEDS: torch.zeros(n, dtype=torch.bool),
        DISCOUNTS: torch.full((n,), 0.99),
    }


def critic_loss(policy: Any) -> float:
    return float(ddpg_loss(policy, policy.model, policy.dist_class, batch()).stats["critic_loss"])


def test_huber_loss_is_half_the_square_below_the_threshold_and_linear_above() -> None:
    plain = policy_of()
    squared = critic_loss(plain)
    assert critic_loss(policy_of(plain, use_huber=True, huber_threshold=1e6)) == pytest.approx(squared / 2, rel=1e-5)
    linear = critic_loss(policy_of(plain, use_huber=True, huber_threshold=1e-3))
    assert linear < squared / 10  # |x| grows slower than x^2 for TD errors of a few units


def test_l2_reg_adds_half_the_squared_weights_of_the_critics() -> None:
    plain = policy_of()
    regularized = policy_of(plain, l2_reg=0.5)
    weights = sum(
        float(p.detach().pow(2).sum()) for name, p in plain.model.critics.named_parameters() if name.endswith("weight")
    )
    assert critic_loss(regularized) == pytest.approx(critic_loss(plain) + 0.5 * 0.5 * weights, rel=1e-5)


def test_exploration_is_derived_when_empty_or_named_gaussian_or_ou() -> None:
    derived = policy_of(learning_starts=123).exploration
    assert isinstance(derived, GaussianNoise) and derived.random_timesteps == 123
    ou = policy_of(exploration_config={"type": "OrnsteinUhlenbeckNoise", "ou_sigma": 0.3}).exploration
    assert isinstance(ou, OrnsteinUhlenbeckNoise) and ou.ou_sigma == 0.3
    with pytest.raises(ConfigError, match="explore with 'GaussianNoise' or 'OrnsteinUhlenbeckNoise'"):
        policy_of(exploration_config={"type": "EpsilonGreedy"})
