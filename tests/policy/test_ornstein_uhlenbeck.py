"""OrnsteinUhlenbeckNoise (DDPG's exploration, as RLlib had it) and GaussianNoise's schedule after the random phase."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from flowrl.policy.distributions import Deterministic
from flowrl.policy.exploration import GaussianNoise, OrnsteinUhlenbeckNoise, make_exploration

pytestmark = pytest.mark.unit

SPACE = gym.spaces.Box(np.array([-2.0, -1.0], np.float32), np.array([2.0, 1.0], np.float32))


def zeros(batch: int = 3) -> Deterministic:
    return Deterministic(torch.zeros(batch, 2))


def test_ou_noise_follows_the_ornstein_uhlenbeck_process() -> None:
    ou = OrnsteinUhlenbeckNoise(
        SPACE,
        ou_theta=0.15,
        ou_sigma=0.2,
        ou_base_scale=0.1,
        initial_scale=1.0,
        final_scale=1.0,
        random_timesteps=0,
        seed=3,
    )
    twin = torch.Generator().manual_seed(3)
    state = torch.zeros(2)
    span = torch.tensor([4.0, 2.0])
    for t in range(5):
        actions, logp = ou.get_action(zeros(), timestep=t, explore=True)
        state = state + 0.15 * -state + 0.2 * torch.randn(2, generator=twin)
        expected = torch.clamp(0.1 * state * span, torch.as_tensor(SPACE.low), torch.as_tensor(SPACE.high))
        torch.testing.assert_close(actions, expected.expand(3, 2))  # one state, shared by the batch's rows
        assert logp.shape == (3,)


def test_ou_noise_is_uniform_first_then_anneals_after_the_random_phase() -> None:
    ou = OrnsteinUhlenbeckNoise(
        SPACE, random_timesteps=100, initial_scale=1.0, final_scale=0.02, scale_timesteps=1000, seed=0
    )
    actions, _ = ou.get_action(Deterministic(torch.full((20_000, 2), 1.9)), timestep=99, explore=True)
    np.testing.assert_allclose(actions.numpy().mean(0), [0.0, 0.0], atol=0.05)  # uniform in the bounds
    assert ou.scale(100) == pytest.approx(1.0)  # RLlib's schedule starts when the random phase ends
    assert ou.scale(600) == pytest.approx(0.51)
    assert ou.scale(1100) == pytest.approx(0.02)
    greedy, _ = ou.get_action(Deterministic(torch.full((2, 2), 0.5)), timestep=500, explore=False)
    torch.testing.assert_close(greedy, torch.full((2, 2), 0.5))


def test_gaussian_noise_anneals_after_its_random_phase_too() -> None:
    noise = GaussianNoise(
        SPACE, stddev=1.0, initial_scale=2.0, final_scale=0.5, scale_timesteps=100, random_timesteps=50
    )
    assert [noise.scale(t) for t in (50, 100, 150, 400)] == pytest.approx([2.0, 1.25, 0.5, 0.5])


def test_ou_state_is_checkpointed() -> None:
    ou = make_exploration(SPACE, {"type": "OrnsteinUhlenbeckNoise", "random_timesteps": 0}, seed=1)
    for t in range(3):
        ou.get_action(zeros(), timestep=t, explore=True)
    restored = make_exploration(SPACE, {"type": "OrnsteinUhlenbeckNoise", "random_timesteps": 0}, seed=99)
    restored.set_state(ou.get_state())
    torch.testing.assert_close(
        restored.get_action(zeros(), timestep=3, explore=True)[0], ou.get_action(zeros(), timestep=3, explore=True)[0]
    )
