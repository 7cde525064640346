"""SAC's losses: the squashed Gaussian's density, where each loss's gradient goes, alpha's tuning,
discrete SAC's masked expectations, and acting (warm-up, deterministic mean)."""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from flowrl.algorithms import get_algorithm
from flowrl.algorithms.sac import DISCRETE_ENTROPY_FRACTION, sac_td_error, sac_terms, target_entropy
from flowrl.data import SampleBatch
from flowrl.errors import ConfigError
from flowrl.policy.postprocessing import DISCOUNTS
from flowrl.policy.sac_networks import squashed_logp

pytestmark = pytest.mark.unit

PENDULUM = (gym.spaces.Box(-1.0, 1.0, (3,), np.float32), gym.spaces.Box(-2.0, 2.0, (1,), np.float32))
DISCRETE = (gym.spaces.Box(-1.0, 1.0, (4,), np.float32), gym.spaces.Discrete(3))


def policy_of(spaces: tuple[gym.Space[Any], gym.Space[Any]] = PENDULUM, **config: Any) -> Any:
    algorithm = get_algorithm("sac")
    cfg = algorithm.config_class.from_dict({"seed": 0, "actor_hiddens": [16], "critic_hiddens": [16], **config})
    return algorithm.make_policy(*spaces, cfg).build()


def batch(spaces: tuple[gym.Space[Any], gym.Space[Any]] = PENDULUM, n: int = 32) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(1)
    obs_dim, action_space = spaces[0].shape[0], spaces[1]
    if isinstance(action_space, gym.spaces.Discrete):
        actions = torch.as_tensor(rng.integers(0, int(action_space.n), n))
    else:
        actions = torch.as_tensor(rng.uniform(-2, 2, size=(n, 1)), dtype=torch.float32)
    return {
        SampleBatch.OBS: torch.as_tensor(rng.normal(size=(n, obs_dim)), dtype=torch.float32),
        SampleBatch.NEW_OBS: torch.as_tensor(rng.normal(size=(n, obs_dim)), dtype=torch.float32),
        SampleBatch.ACTIONS: actions,
        SampleBatch.REWARDS: torch.as_tensor(rng.normal(size=n), dtype=torch.float32),
        SampleBatch.TERMINATEDS: torch.zeros(n, dtype=torch.bool),
        DISCOUNTS: torch.full((n,), 0.9),
    }


def test_squashed_log_density_matches_the_change_of_variables_by_a_numeric_jacobian() -> None:
    mean, log_std = torch.tensor([[0.3, -1.0]], dtype=torch.float64), torch.tensor([[-0.5, 0.2]], dtype=torch.float64)
    low, high = torch.tensor([-2.0, 0.0], dtype=torch.float64), torch.tensor([2.0, 1.0], dtype=torch.float64)
    squash = lambda raw: low + (torch.tanh(raw) + 1.0) * 0.5 * (high - low)  # noqa: E731
    for raw in (torch.tensor([[0.1, -0.7]]), torch.tensor([[1.5, 2.5]]), torch.tensor([[-3.0, 0.0]])):
        raw = raw.double()
        gaussian = torch.distributions.Normal(mean, log_std.exp()).log_prob(raw)
        h = 1e-6  # each dimension squashes on its own: the Jacobian is diagonal
        slope = (squash(raw + h) - squash(raw - h)) / (2 * h)
        reference = (gaussian - slope.log()).sum(-1)
        torch.testing.assert_close(
            squashed_logp(raw, mean, log_std, 0.5 * (high - low)), reference, rtol=1e-6, atol=1e-6
        )


def test_squashed_log_density_integrates_to_one_and_stays_finite_where_tanh_saturates() -> None:
    mean, log_std, half_range = torch.tensor([[0.5]]), torch.tensor([[0.0]]), torch.tensor([2.0])
    # Integrate the density over the actions in (-2, 2): raw over a fine grid, da = slope * draw.
    raw = torch.linspace(-12.0, 12.0, 200_001, dtype=torch.float64).unsqueeze(1)
    density = squashed_logp(raw, mean.double(), log_std.double(), half_range.double()).exp()
    slope = 2.0 * (1.0 - torch.tanh(raw.squeeze(1)).square())
    assert float(torch.trapezoid(density * slope, raw.squeeze(1))) == pytest.approx(1.0, abs=1e-4)
    far = squashed_logp(torch.tensor([[30.0]]), mean, log_std, half_range)
    assert bool(torch.isfinite(far).all())


@pytest.mark.parametrize("spaces", [PENDULUM, DISCRETE], ids=["continuous", "discrete"])
def test_each_loss_moves_only_its_own_parameters(spaces: Any) -> None:
    policy = policy_of(spaces)
    model = policy.model
    terms = sac_terms(policy, model, batch(spaces))
    groups = {"actor": list(model.actor.parameters()), "critics": list(model.critics.parameters())}
    groups["alpha"] = [model.log_alpha]

    def moved(loss: torch.Tensor) -> set[str]:
        names = []
        for name, params in groups.items():
            grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
            if any(g is not None and float(g.abs().sum()) > 0 for g in grads):
                names.append(name)
        return set(names)

    assert moved(terms.actor_loss) == {"actor"}
    assert moved(terms.critic_loss) == {"critics"}
    assert moved(terms.alpha_loss) == {"alpha"}
    assert all(p.requires_grad for p in model.critics.parameters())  # frozen only while the actor's term records


@pytest.mark.parametrize("spaces", [PENDULUM, DISCRETE], ids=["continuous", "discrete"])
@pytest.mark.parametrize(("target", "grows"), [(100.0, True), (-100.0, False)], ids=["below-target", "above-target"])
def test_alpha_moves_towards_the_target_entropy(spaces: Any, target: float, grows: bool) -> None:
    policy = policy_of(spaces, target_entropy=target, lr=0.01)
    before = float(policy.model.log_alpha.detach().exp())
    data = {k: v.numpy() for k, v in batch(spaces).items()}
    for _ in range(3):
        stats = policy.learn(SampleBatch(data)).stats
    after = float(policy.model.log_alpha.detach().exp())
    # The entropy is far below a target of 100 nats (alpha grows) and far above -100 (alpha shrinks).
    assert (after > before) == grows and after != before
    assert stats["alpha"] > 0 and math.isfinite(stats["entropy"])


def test_discrete_targets_take_the_expectation_over_the_legal_next_actions_only() -> None:
    policy = policy_of(DISCRETE)
    model, target = policy.model, policy.target_model
    data = batch(DISCRETE, n=3)
    # Row 0: every action legal; row 1: only action 2; row 2: none (a state worth 0).
    data[SampleBatch.NEXT_ACTION_MASK] = torch.tensor([[1, 1, 1], [0, 0, 1], [0, 0, 0]], dtype=torch.bool)
    terms = sac_terms(policy, model, data)
    with torch.no_grad():
        alpha = model.log_alpha.exp()
        next_q = torch.minimum(*target.q_all(data[SampleBatch.NEW_OBS]))
        probs = torch.softmax(model.dist_inputs(data[SampleBatch.NEW_OBS]), -1)
        soft = (probs[0] * (next_q[0] - alpha * probs[0].log())).sum()
        expected = data[SampleBatch.REWARDS] + 0.9 * torch.stack([soft, next_q[1, 2], torch.tensor(0.0)])
    torch.testing.assert_close(terms.q_target, expected)


def test_discrete_actor_and_entropy_ignore_illegal_actions() -> None:
    policy = policy_of(DISCRETE)
    data = batch(DISCRETE, n=4)
    data[SampleBatch.ACTION_MASK] = torch.tensor([[0, 1, 0]] * 4, dtype=torch.bool)
    terms = sac_terms(policy, policy.model, data)
    # One legal action: the policy is certain, log pi = 0, and nothing is NaN.
    torch.testing.assert_close(terms.logp, torch.zeros(4))
    assert all(bool(torch.isfinite(t).all()) for t in (terms.actor_loss, terms.critic_loss, terms.alpha_loss))


def test_target_entropy_auto_and_numbers() -> None:
    config = get_algorithm("sac").config_class.from_dict({})
    assert target_entropy(config, gym.spaces.Box(-1.0, 1.0, (6,))) == -6.0
    assert target_entropy(config, gym.spaces.Discrete(4)) == pytest.approx(DISCRETE_ENTROPY_FRACTION * math.log(4))
    assert target_entropy(config.replace(target_entropy=-2.5), gym.spaces.Discrete(4)) == -2.5
    with pytest.raises(ConfigError, match="target_entropy"):
        config.replace(target_entropy="high")


def test_acting_warms_up_uniformly_then_samples_and_explore_false_gives_the_squashed_mean() -> None:
    policy = policy_of(learning_starts=100)
    obs = np.zeros((500, 3), np.float32)
    warm, _ = policy.compute_actions(obs, explore=True, timestep=0)
    assert warm.min() >= -2.0 and warm.max() <= 2.0 and warm.std() > 0.9  # uniform on [-2, 2]: std 1.15
    mean_actions, _ = policy.compute_actions(obs[:2], explore=False, timestep=1000)
    with torch.no_grad():
        mean = policy.model.dist_inputs(torch.zeros(2, 3))[:, :1]
    np.testing.assert_allclose(mean_actions, (2.0 * torch.tanh(mean)).numpy(), rtol=1e-5, atol=1e-6)
    sampled, _ = policy.compute_actions(obs, explore=True, timestep=1000)
    assert sampled.std() > 0 and not np.allclose(sampled, mean_actions[0])


def test_discrete_warm_up_picks_only_legal_actions() -> None:
    policy = policy_of(DISCRETE, learning_starts=100)
    mask = np.tile(np.array([[1, 0, 1]], np.int8), (200, 1))
    actions, _ = policy.compute_actions(np.zeros((200, 4), np.float32), explore=True, timestep=0, action_mask=mask)
    assert set(actions.tolist()) == {0, 2}


def test_a_live_lr_moves_only_the_groups_without_a_rate_of_their_own() -> None:
    policy = policy_of(lr=1e-3, critic_lr=5e-4)
    policy.update_config({"lr": 1e-2})
    assert [g["lr"] for g in policy.optimizer.param_groups] == [1e-2, 5e-4, 1e-2]


def test_an_lr_schedule_sets_the_groups_that_follow_lr_and_scales_those_with_their_own() -> None:
    policy = policy_of(lr=1e-3, critic_lr=5e-4, lr_schedule=[[0, 1e-3], [1000, 1e-4]])
    policy.global_timestep = 500
    policy.learning_rates.set(policy.config, policy.global_timestep)
    rates = [g["lr"] for g in policy.optimizer.param_groups]
    assert rates == pytest.approx([5.5e-4, 5e-4 * 0.55, 5.5e-4])  # actor and alpha follow lr; the critics scale


def test_an_entropy_coeff_schedule_sets_alpha_which_then_learns_nothing() -> None:
    policy = policy_of(entropy_coeff_schedule=[[0, 0.5], [1000, 0.1]])
    policy.global_timestep = 250
    log_alpha = policy.model.log_alpha.detach().clone()
    terms = sac_terms(policy, policy.model, batch())
    assert float(terms.alpha) == pytest.approx(0.4)
    policy.learn(SampleBatch({k: v.numpy() for k, v in batch().items()}))
    torch.testing.assert_close(policy.model.log_alpha.detach(), log_alpha)


def test_the_td_error_for_worker_priorities_is_the_losses_for_the_same_rows() -> None:
    policy = policy_of(DISCRETE, prioritized_replay=True, worker_side_prioritization=True)
    rows = batch(DISCRETE)
    terms = sac_terms(policy, policy.model, rows)
    torch.testing.assert_close(sac_td_error(policy, rows), (terms.q_taken - terms.q_target).detach())
    continuous = policy_of(prioritized_replay=True, worker_side_prioritization=True)
    assert sac_td_error(continuous, batch()).shape == (32,)


class _NoCritics(nn.Module):
    def __init__(self, obs_space: Any, action_space: Any, num_outputs: int) -> None:
        super().__init__()
        self.actor = nn.Linear(3, 2)


class _WrongActor(_NoCritics):
    def __init__(self, obs_space: Any, action_space: Any, num_outputs: int) -> None:
        super().__init__(obs_space, action_space, num_outputs)
        self.actor = nn.Linear(3, 5)
        self.critics = nn.ModuleList(nn.Linear(4, 1) for _ in range(2))


class _Fits(_NoCritics):
    def __init__(self, obs_space: Any, action_space: Any, num_outputs: int) -> None:
        super().__init__(obs_space, action_space, num_outputs)
        self.critics = nn.ModuleList(nn.Linear(4, 1) for _ in range(2))


def test_custom_models_must_fit_the_stochastic_actor_critic_interface() -> None:
    with pytest.raises(ConfigError, match="stochastic actor-critic interface"):
        policy_of(model={"custom_model": _NoCritics})
    with pytest.raises(ConfigError, match=r"its actor gives \[2, 5\]"):
        policy_of(model={"custom_model": _WrongActor})
    policy = policy_of(model={"custom_model": _Fits})
    assert policy.model.actor is not None and policy.compute_actions(np.zeros((2, 3), np.float32))[0].shape == (2, 1)


def test_config_refuses_other_explorations_and_unbounded_actions() -> None:
    with pytest.raises(ConfigError, match="SAC explores by sampling its policy"):
        policy_of(exploration_config={"type": "EpsilonGreedy"})
    with pytest.raises(ConfigError, match="must be finite"):
        policy_of((PENDULUM[0], gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)))
