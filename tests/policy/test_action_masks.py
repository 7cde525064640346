"""The masking primitives: masked logits and Q-values (the TD target's argmax and max too), legal
random actions, and a policy that acts and learns with masks."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from flowrl.algorithms.dqn import DQNConfig, make_dqn_policy
from flowrl.algorithms.ppo import PPOConfig, make_ppo_policy
from flowrl.data import SampleBatch
from flowrl.errors import FlowRLError
from flowrl.policy.action_masks import mask_logits, masked_bootstrap_q, random_legal_actions
from flowrl.policy.distributions import Categorical, DiagGaussian
from flowrl.policy.exploration import EpsilonGreedy
from flowrl.policy.postprocessing import adjust_nstep

pytestmark = pytest.mark.unit

MASK = torch.tensor([[True, False, True, False], [False, False, False, True]])


def test_masked_logits_give_illegal_actions_no_probability_and_finite_statistics() -> None:
    logits = torch.tensor([[0.0, 50.0, 1.0, 9.0], [3.0, 2.0, 1.0, -4.0]], requires_grad=True)
    dist = Categorical.with_action_mask(MASK)(logits)
    probs = dist.log_probs.exp()
    assert torch.all(probs[~MASK] == 0)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2))
    assert dist.deterministic_sample().tolist() == [2, 3]
    torch.manual_seed(0)
    assert all(MASK[torch.arange(2), Categorical.with_action_mask(MASK)(logits).sample()].all() for _ in range(200))
    loss = dist.entropy().sum() + dist.kl(Categorical.with_action_mask(MASK)(logits.detach() + 1)).sum()
    loss = loss - dist.logp(torch.tensor([0, 3])).sum()
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()
    assert torch.all(logits.grad[~MASK] == 0)  # illegal logits learn nothing
    unmasked = Categorical(logits.detach())
    assert unmasked.deterministic_sample().tolist() == [1, 0]


def test_a_row_with_no_legal_action_stays_a_distribution() -> None:
    dist = Categorical.with_action_mask(torch.zeros(1, 3, dtype=torch.bool))(torch.tensor([[1.0, 2.0, 3.0]]))
    torch.testing.assert_close(dist.log_probs.exp(), torch.full((1, 3), 1 / 3))
    assert torch.isfinite(dist.entropy()).all()


def test_only_categorical_distributions_take_masks() -> None:
    with pytest.raises(FlowRLError, match="action masks need a Discrete action space"):
        DiagGaussian.with_action_mask(MASK)


def test_td_targets_range_over_the_next_states_legal_actions() -> None:
    target = torch.tensor([[10.0, 1.0, 2.0, 3.0], [5.0, 6.0, 7.0, 8.0], [1.0, 1.0, 1.0, 1.0]])
    online = torch.tensor([[0.0, 9.0, 1.0, 2.0], [9.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[False, True, True, False], [True, False, True, False], [False, False, False, False]])
    # Max over legal target values: 2 (not 10), 7 (not 8), and 0 where nothing is legal.
    assert masked_bootstrap_q(target, None, mask).tolist() == [2.0, 7.0, 0.0]
    # Double Q: the online argmax among legal actions (1, then 0), valued by the target.
    assert masked_bootstrap_q(target, online, mask).tolist() == [1.0, 5.0, 0.0]
    assert masked_bootstrap_q(target, online, None).tolist() == [1.0, 5.0, 1.0]
    assert masked_bootstrap_q(target, None, None).tolist() == [10.0, 8.0, 1.0]
    assert mask_logits(target, mask)[0, 0] == torch.finfo(torch.float32).min


def test_random_and_epsilon_greedy_actions_are_legal() -> None:
    rng = np.random.default_rng(0)
    mask = rng.random((5000, 6)) < 0.3
    mask[:, 5] = True  # at least one legal action per row
    mask[:2000] = True
    drawn = random_legal_actions(mask, rng)
    assert mask[np.arange(len(mask)), drawn].all()
    counts = np.bincount(drawn[:2000], minlength=6)  # rows where all are legal: uniform
    assert counts.min() > 0.6 * counts.mean()
    greedy = EpsilonGreedy(gym.spaces.Discrete(6), epsilon=1.0, seed=0)
    q = torch.as_tensor(rng.standard_normal((5000, 6)), dtype=torch.float32)
    actions, _ = greedy.get_action(Categorical.with_action_mask(torch.as_tensor(mask))(q), timestep=0, explore=True)
    assert mask[np.arange(len(mask)), actions.numpy()].all()
    unmasked, _ = EpsilonGreedy(gym.spaces.Discrete(6), epsilon=1.0, seed=0).get_action(
        Categorical(q), timestep=0, explore=True
    )
    assert not mask[np.arange(len(mask)), unmasked.numpy()].all()  # without the mask, illegal actions


def masked_space() -> gym.spaces.Dict:
    return gym.spaces.Dict(
        {"observations": gym.spaces.Box(-1, 1, (3,)), "action_mask": gym.spaces.Box(0, 1, (4,), np.int8)}
    )


@pytest.mark.parametrize("make", ["ppo", "dqn"])
def test_policies_act_legally_and_see_only_the_observations(make: str) -> None:
    space, actions = masked_space(), gym.spaces.Discrete(4)
    if make == "ppo":
        spec = make_ppo_policy(space, actions, PPOConfig(seed=0))
    else:
        config = DQNConfig(seed=0, exploration_config={"type": "EpsilonGreedy", "epsilon": 0.5})
        spec = make_dqn_policy(space, actions, config)
    policy = spec.build()
    assert policy.model_observation_space == space["observations"]
    rng = np.random.default_rng(1)
    obs = rng.uniform(-1, 1, (2000, 3)).astype(np.float32)
    mask = rng.random((2000, 4)) < 0.5
    mask[np.arange(2000), rng.integers(0, 4, 2000)] = True
    for explore in (True, False):
        chosen, extra = policy.compute_actions(obs, explore=explore, action_mask=mask)
        assert mask[np.arange(2000), chosen].all()
        assert (extra[SampleBatch.ACTION_DIST_INPUTS][~mask] == np.finfo(np.float32).min).all()
    single = policy.compute_single_action({"observations": obs[0], "action_mask": np.array([0, 0, 1, 0], np.int8)})
    assert single == 2


def test_nstep_transitions_carry_the_mask_of_their_new_obs() -> None:
    masks = np.eye(4, dtype=bool)
    batch = SampleBatch(
        {
            SampleBatch.REWARDS: np.ones(4, np.float32),
            SampleBatch.NEW_OBS: np.arange(4, dtype=np.float32)[:, None],
            SampleBatch.TERMINATEDS: np.zeros(4, bool),
            SampleBatch.TRUNCATEDS: np.zeros(4, bool),
            SampleBatch.NEXT_ACTION_MASK: masks,
        }
    )
    adjust_nstep(batch, 3, 0.9)
    np.testing.assert_array_equal(batch[SampleBatch.NEXT_ACTION_MASK], masks[[2, 3, 3, 3]])


def test_dqn_loss_bootstraps_from_the_best_legal_next_action() -> None:
    space, actions = masked_space(), gym.spaces.Discrete(4)
    config = DQNConfig(seed=0, n_step=1, double_q=False, dueling=False, gamma=0.5)
    policy = make_dqn_policy(space, actions, config).build()
    obs = np.zeros((1, 3), np.float32)
    q_next = policy.compute_actions(obs, explore=False)[1][SampleBatch.ACTION_DIST_INPUTS][0]
    legal = np.zeros(4, bool)
    legal[int(np.argmin(q_next))] = True  # only the worst action is legal in the next state
    batch = SampleBatch(
        {
            SampleBatch.OBS: obs,
            SampleBatch.NEW_OBS: obs,
            SampleBatch.ACTIONS: np.zeros(1, np.int64),
            SampleBatch.REWARDS: np.ones(1, np.float32),
            SampleBatch.TERMINATEDS: np.zeros(1, bool),
            SampleBatch.TRUNCATEDS: np.zeros(1, bool),
            "discounts": np.full(1, 0.5, np.float32),
            SampleBatch.ACTION_MASK: np.ones((1, 4), bool),
            SampleBatch.NEXT_ACTION_MASK: legal[None],
        }
    )
    td_error = policy.learn(batch).td_error
    assert td_error is not None
    expected = q_next[0] - (1.0 + 0.5 * q_next.min())
    np.testing.assert_allclose(td_error, [expected], rtol=1e-5)
