"""DDPG/TD3's training path: what the loss computes and leaves behind, and the tuned examples' update rate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml

from flowrl.algorithms import get_algorithm
from flowrl.algorithms.ddpg import ACTOR_STEPS, ddpg_loss
from flowrl.algorithms.dqn import round_robin_weights
from flowrl.data import SampleBatch
from flowrl.policy.postprocessing import DISCOUNTS

pytestmark = pytest.mark.unit

ENV = gym.make("Pendulum-v1")
TUNED = Path(__file__).resolve().parents[2] / "tuned_examples"


def policy_of(algo: str = "td3", **config: Any) -> Any:
    algorithm = get_algorithm(algo)
    cfg = algorithm.config_class.from_dict({"seed": 0, "actor_hiddens": [8], "critic_hiddens": [8], **config})
    return algorithm.make_policy(ENV.observation_space, ENV.action_space, cfg).build()


def batch(n: int = 16, terminated: bool = False) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(1)
    return {
        SampleBatch.OBS: torch.as_tensor(rng.normal(size=(n, 3)), dtype=torch.float32),
        SampleBatch.NEW_OBS: torch.as_tensor(rng.normal(size=(n, 3)), dtype=torch.float32),
        SampleBatch.ACTIONS: torch.as_tensor(rng.uniform(-2, 2, size=(n, 1)), dtype=torch.float32),
        SampleBatch.REWARDS: torch.as_tensor(rng.normal(size=n), dtype=torch.float32),
        SampleBatch.TERMINATEDS: torch.full((n,), terminated, dtype=torch.bool),
        DISCOUNTS: torch.full((n,), 0.9),
    }


def grads_of(
    policy: Any, actor_step: bool
) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None], dict[str, float]]:
    """The actor's and critics' gradients of one TD3 loss (policy_delay 2), with or without its actor step."""
    policy.coeffs[ACTOR_STEPS] = (
        1 if actor_step else 0
    )  # the loss counts this step, then updates the actor on even counts
    policy.model.zero_grad(set_to_none=True)
    torch.manual_seed(0)  # the same target smoothing noise either way
    out = ddpg_loss(policy, policy.model, policy.dist_class, batch())
    out.loss.backward()
    grads = lambda module: [None if p.grad is None else p.grad.clone() for p in module.parameters()]  # noqa: E731
    return grads(policy.model.actor), grads(policy.model.critics), out.stats


def test_the_actor_step_moves_the_actor_and_leaves_the_critics_gradient_alone() -> None:
    policy = policy_of()
    actor_alone, critics_alone, stats_alone = grads_of(policy, actor_step=False)
    actor_both, critics_both, stats_both = grads_of(policy, actor_step=True)
    assert "actor_loss" not in stats_alone and "actor_loss" in stats_both
    assert all(g is None for g in actor_alone)
    assert all(g is not None and float(g.abs().sum()) > 0 for g in actor_both)
    for alone, both in zip(critics_alone, critics_both):
        assert alone is not None and both is not None
        torch.testing.assert_close(both, alone)
    # The critic is frozen only while the actor's loss is recorded.
    assert all(p.requires_grad for p in policy.model.critics.parameters())


def test_td_errors_come_back_only_with_prioritized_replay() -> None:
    plain = policy_of(prioritized_replay=False)
    assert ddpg_loss(plain, plain.model, plain.dist_class, batch()).td_error is None
    prioritized = policy_of(prioritized_replay=True)
    data = batch(terminated=True)
    out = ddpg_loss(prioritized, prioritized.model, prioritized.dist_class, data)
    assert out.td_error is not None
    # A terminated row's target is its reward alone.
    with torch.no_grad():
        q = prioritized.model.q(data[SampleBatch.OBS], data[SampleBatch.ACTIONS])[0]
    torch.testing.assert_close(out.td_error.detach(), q - data[SampleBatch.REWARDS])


@pytest.mark.parametrize("algo", ["ddpg", "td3"])
def test_actions_are_the_squashed_actor_output_within_the_bounds(algo: str) -> None:
    model = policy_of(algo).model
    obs = batch()[SampleBatch.OBS] * 50  # large inputs: the tanh saturates at the bounds
    with torch.no_grad():
        actions = model.act(obs)
        expected = model.low + (torch.tanh(model.actor(obs)) + 1.0) * 0.5 * (model.high - model.low)
    torch.testing.assert_close(actions, expected)
    assert bool((actions >= model.low).all() and (actions <= model.high).all())
    # The bounds' derived forms stay out of checkpoints: the state dict keeps its keys.
    assert {"low", "high"} <= set(model.state_dict()) and not {"mid", "half_range"} & set(model.state_dict())


@pytest.mark.parametrize("example", ["pendulum-td3.yaml", "pendulum-ddpg.yaml"])
def test_tuned_examples_make_one_update_per_env_step(example: str) -> None:
    spec = yaml.safe_load((TUNED / example).read_text())
    config = get_algorithm(spec["algo"]).config_class.from_dict(spec["config"])
    store, replay = round_robin_weights(config)
    assert config.rollout_fragment_length > 1  # several env steps per sample call
    assert replay / (store * config.sampled_per_round()) == 1.0
