"""Issue 36's OPE acceptance: on CartPole episodes recorded by a known stochastic policy, WIS and DR estimate
the value of a DIFFERENT known policy within 10% of its Monte Carlo value.

Both policies are scripted: they push right with probability ``eps / 2 + (1 - eps) * sigmoid(k * (angle +
angular velocity / 2))``; the recording one is softer and more random (k 3, eps 0.3) than the target (k 4,
eps 0.2), whose discounted value is about 40% higher. The target's value is measured by playing it.
"""

from __future__ import annotations

from collections.abc import Iterator

import gymnasium as gym
import numpy as np
import pytest
import torch

from flowrl.policy.off_policy_estimation import Episodes, estimate, fitted_q_evaluation

# Not a learning test of an agent, but a seeded accuracy threshold with a fitting budget: the learning tier.
pytestmark = pytest.mark.learning

GAMMA = 0.99
EPISODES = 400
BEHAVIOR = (3.0, 0.3)  # (k, eps)
TARGET = (4.0, 0.2)


def push_right(obs: np.ndarray, policy: tuple[float, float]) -> np.ndarray:
    k, eps = policy
    return eps / 2 + (1 - eps) / (1 + np.exp(-k * (obs[..., 2] + 0.5 * obs[..., 3])))


def play(policy: tuple[float, float], seed: int) -> tuple[Episodes, np.ndarray]:
    """``EPISODES`` episodes of ``policy`` and each one's discounted return."""
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    obs_rows, actions, rewards, logps, starts, returns = [], [], [], [], [], []
    for i in range(EPISODES):
        obs, _ = env.reset(seed=seed * 10_000 + i)
        starts.append(len(rewards))
        done, discounted, t = False, 0.0, 0
        while not done:
            p = float(push_right(obs, policy))
            action = int(rng.random() < p)
            obs_rows.append(obs)
            actions.append(action)
            logps.append(np.log(p if action else 1 - p))
            obs, reward, terminated, truncated, _ = env.step(action)
            rewards.append(float(reward))
            discounted += GAMMA**t * float(reward)
            t += 1
            done = terminated or truncated
        returns.append(discounted)
    env.close()
    episodes = Episodes(
        np.array(obs_rows, np.float32), np.array(actions), np.array(rewards), np.array(logps), np.array(starts)
    )
    return episodes, np.array(returns)


@pytest.fixture
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
def test_wis_and_dr_estimate_another_policys_value_within_10_percent() -> None:
    data, behavior_returns = play(BEHAVIOR, seed=1)
    _, target_returns = play(TARGET, seed=101)
    truth = float(target_returns.mean())
    # An honest off-policy task: the recorded episodes' own value is far from the target's.
    assert abs(behavior_returns.mean() - truth) > 0.2 * truth

    right = push_right(data.obs, TARGET)
    probs = np.stack([1 - right, right], axis=1)
    target_logp = np.log(probs[np.arange(len(data.actions)), data.actions])
    q = fitted_q_evaluation(data, probs, GAMMA, steps=1500, seed=0)
    wis = estimate("wis", data, target_logp, GAMMA)
    dr = estimate("dr", data, target_logp, GAMMA, q_values=q, target_probs=probs)
    assert wis.v_behavior == pytest.approx(behavior_returns.mean())
    errors = {"wis": (wis.v_target - truth) / truth, "dr": (dr.v_target - truth) / truth}
    print(f"truth {truth:.2f}, behaviour {wis.v_behavior:.2f}, relative errors {errors}")
    assert abs(errors["wis"]) <= 0.10
    assert abs(errors["dr"]) <= 0.10
