"""Postprocessing: discounted sums, GAE (hand-computed), plain returns, n-step transitions."""

from __future__ import annotations

import numpy as np
import pytest

from flowrl.data import SampleBatch
from flowrl.policy import adjust_nstep, bootstrap_value, compute_advantages, discount_cumsum
from flowrl.policy.postprocessing import DISCOUNTS

pytestmark = pytest.mark.unit

GAMMA, LAMBDA = 0.9, 0.8


# -- discount_cumsum --------------------------------------------------------------------


def hand_discount_cumsum(x: np.ndarray, gamma: float) -> np.ndarray:
    return np.array([sum(gamma**k * x[t + k] for k in range(len(x) - t)) for t in range(len(x))], dtype=np.float64)


@pytest.mark.parametrize("gamma", [0.0, 0.5, 0.95, 0.99, 1.0])
def test_discount_cumsum_matches_hand_loop(gamma: float) -> None:
    x = np.random.default_rng(0).standard_normal(37)
    np.testing.assert_allclose(discount_cumsum(x, gamma), hand_discount_cumsum(x, gamma), rtol=1e-5, atol=1e-5)


def test_discount_cumsum_small_explicit() -> None:
    np.testing.assert_allclose(discount_cumsum(np.array([1.0, 2.0, 3.0]), 0.5), [2.75, 3.5, 3.0])
    assert discount_cumsum(np.zeros(0), 0.9).shape == (0,)
    out = discount_cumsum(np.array([1, 1], dtype=np.int64), 0.9)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [1.9, 1.0])


# -- GAE and returns on a 3-step trajectory, gamma=0.9, lambda=0.8 -----------------------
#
# rewards r = [1, 2, 3], vf_preds V = [0.5, 1.0, 1.5], gamma * lambda = 0.72.
#
# Terminated (V after = 0):
#   deltas  d = r_t + 0.9 V_{t+1} - V_t = [1 + 0.9 - 0.5, 2 + 1.35 - 1.0, 3 + 0 - 1.5] = [1.4, 2.35, 1.5]
#   A2 = 1.5; A1 = 2.35 + 0.72 * 1.5 = 3.43; A0 = 1.4 + 0.72 * 3.43 = 3.8696
#   targets = A + V = [4.3696, 4.43, 3.0]
#
# Truncated, V(last new_obs) = 2.0:
#   d2 = 3 + 0.9 * 2.0 - 1.5 = 3.3
#   A2 = 3.3; A1 = 2.35 + 0.72 * 3.3 = 4.726; A0 = 1.4 + 0.72 * 4.726 = 4.80272
#   targets = [5.30272, 5.726, 4.8]
#
# Plain returns (no GAE):
#   terminated: R = [1 + 0.9 * 4.7, 2 + 0.9 * 3, 3] = [5.23, 4.7, 3.0]
#   truncated (last_r = 2): R2 = 4.8, R1 = 2 + 4.32 = 6.32, R0 = 1 + 5.688 = 6.688


def trajectory(terminated: bool) -> SampleBatch:
    return SampleBatch(
        obs=np.array([[0.0, 0.0], [0.0, 0.5], [0.0, 1.0]], np.float32),
        # The fake value function below sums new_obs: the last row's value is 2.0.
        new_obs=np.array([[0.0, 0.5], [0.0, 1.0], [1.5, 0.5]], np.float32),
        actions=np.array([0, 1, 0]),
        rewards=np.array([1.0, 2.0, 3.0], np.float32),
        terminateds=np.array([False, False, terminated]),
        truncateds=np.array([False, False, not terminated]),
        vf_preds=np.array([0.5, 1.0, 1.5], np.float32),
    )


def fake_value_fn(obs: np.ndarray) -> np.ndarray:
    assert obs.shape == (1, 2), "bootstrap_value should pass the last new_obs as a batch of one"
    return obs.sum(axis=1)


def failing_value_fn(obs: np.ndarray) -> np.ndarray:
    raise AssertionError("a terminated piece must not query the value function")


def test_bootstrap_value_terminated_is_zero_without_calling_value_fn() -> None:
    assert bootstrap_value(trajectory(terminated=True), failing_value_fn) == 0.0


def test_bootstrap_value_truncated_uses_last_new_obs() -> None:
    assert bootstrap_value(trajectory(terminated=False), fake_value_fn) == pytest.approx(2.0)


def test_bootstrap_value_fragment_cut_mid_episode_bootstraps() -> None:
    b = trajectory(terminated=False)
    b["truncateds"][:] = False  # cut by the fragment boundary, neither flag set
    assert bootstrap_value(b, fake_value_fn) == pytest.approx(2.0)


def test_bootstrap_value_empty_piece_is_zero() -> None:
    assert bootstrap_value(trajectory(True).slice(0, 0), failing_value_fn) == 0.0


def test_gae_terminated_hand_computed() -> None:
    b = trajectory(terminated=True)
    out = compute_advantages(b, bootstrap_value(b, failing_value_fn), gamma=GAMMA, lambda_=LAMBDA)
    assert out is b
    np.testing.assert_allclose(b["advantages"], [3.8696, 3.43, 1.5], rtol=1e-5)
    np.testing.assert_allclose(b["value_targets"], [4.3696, 4.43, 3.0], rtol=1e-5)
    assert b["advantages"].dtype == np.float32 and b["value_targets"].dtype == np.float32


def test_gae_truncated_bootstraps_from_value_of_new_obs() -> None:
    b = trajectory(terminated=False)
    compute_advantages(b, bootstrap_value(b, fake_value_fn), gamma=GAMMA, lambda_=LAMBDA)
    np.testing.assert_allclose(b["advantages"], [4.80272, 4.726, 3.3], rtol=1e-5)
    np.testing.assert_allclose(b["value_targets"], [5.30272, 5.726, 4.8], rtol=1e-5)


def test_gae_lambda_one_equals_returns_minus_values_and_lambda_zero_is_td() -> None:
    b = compute_advantages(trajectory(True), 0.0, gamma=GAMMA, lambda_=1.0)
    np.testing.assert_allclose(b["advantages"], np.array([5.23, 4.7, 3.0]) - [0.5, 1.0, 1.5], rtol=1e-5)
    b = compute_advantages(trajectory(True), 0.0, gamma=GAMMA, lambda_=0.0)
    np.testing.assert_allclose(b["advantages"], [1.4, 2.35, 1.5], rtol=1e-5)


def test_returns_without_gae_with_critic_terminated() -> None:
    b = compute_advantages(trajectory(True), 0.0, gamma=GAMMA, use_gae=False, use_critic=True)
    np.testing.assert_allclose(b["value_targets"], [5.23, 4.7, 3.0], rtol=1e-5)
    np.testing.assert_allclose(b["advantages"], [4.73, 3.7, 1.5], rtol=1e-5)


def test_returns_without_gae_with_critic_truncated() -> None:
    b = trajectory(False)
    compute_advantages(b, bootstrap_value(b, fake_value_fn), gamma=GAMMA, use_gae=False, use_critic=True)
    np.testing.assert_allclose(b["value_targets"], [6.688, 6.32, 4.8], rtol=1e-5)
    np.testing.assert_allclose(b["advantages"], [6.188, 5.32, 3.3], rtol=1e-5)


def test_returns_without_gae_or_critic_needs_no_vf_preds() -> None:
    b = trajectory(True)
    del b["vf_preds"]
    compute_advantages(b, 0.0, gamma=GAMMA, use_gae=False, use_critic=False)
    np.testing.assert_allclose(b["advantages"], [5.23, 4.7, 3.0], rtol=1e-5)
    np.testing.assert_allclose(b["value_targets"], [0.0, 0.0, 0.0])
    b = trajectory(False)
    del b["vf_preds"]
    compute_advantages(b, 2.0, gamma=GAMMA, use_gae=False, use_critic=False)
    np.testing.assert_allclose(b["advantages"], [6.688, 6.32, 4.8], rtol=1e-5)


def test_compute_advantages_leaves_other_columns_alone() -> None:
    b = trajectory(True)
    ref = b.copy()
    compute_advantages(b, 0.0, gamma=GAMMA, lambda_=LAMBDA)
    for k in ref:
        np.testing.assert_array_equal(b[k], ref[k])
    assert b.count == 3


# -- n-step -----------------------------------------------------------------------------
#
# 5 steps, rewards [1, 2, 3, 4, 5], gamma = 0.9, n = 3:
#   r0 = 1 + 0.9*2 + 0.81*3 = 5.23      steps 3, new_obs of row 2
#   r1 = 2 + 0.9*3 + 0.81*4 = 7.94      steps 3, new_obs of row 3
#   r2 = 3 + 0.9*4 + 0.81*5 = 10.65     steps 3, new_obs of row 4
#   r3 = 4 + 0.9*5          = 8.5       steps 2, new_obs of row 4
#   r4 = 5                              steps 1, new_obs of row 4


def five_steps(terminated: bool = True) -> SampleBatch:
    end = np.array([False, False, False, False, True])
    return SampleBatch(
        obs=np.arange(5, dtype=np.float32)[:, None],
        new_obs=np.arange(1, 6, dtype=np.float32)[:, None],
        actions=np.array([10, 11, 12, 13, 14]),
        rewards=np.array([1.0, 2.0, 3.0, 4.0, 5.0], np.float32),
        terminateds=end if terminated else ~np.ones(5, bool),
        truncateds=~np.ones(5, bool) if terminated else end,
    )


def test_adjust_nstep_terminated_trajectory() -> None:
    b = five_steps(terminated=True)
    out = adjust_nstep(b, 3, GAMMA)
    assert out is b
    assert b.count == 5
    np.testing.assert_allclose(b["rewards"], [5.23, 7.94, 10.65, 8.5, 5.0], rtol=1e-6)
    np.testing.assert_array_equal(b["new_obs"][:, 0], [3, 4, 5, 5, 5])
    np.testing.assert_array_equal(b["terminateds"], [False, False, True, True, True])
    np.testing.assert_array_equal(b["truncateds"], [False] * 5)
    np.testing.assert_allclose(b[DISCOUNTS], [0.729, 0.729, 0.729, 0.81, 0.9], rtol=1e-6)
    assert b[DISCOUNTS].dtype == np.float32
    # obs and actions stay those of the first step of each transition.
    np.testing.assert_array_equal(b["obs"][:, 0], [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(b["actions"], [10, 11, 12, 13, 14])


def test_adjust_nstep_truncated_trajectory_moves_truncated_flag() -> None:
    b = adjust_nstep(five_steps(terminated=False), 3, GAMMA)
    np.testing.assert_array_equal(b["terminateds"], [False] * 5)
    np.testing.assert_array_equal(b["truncateds"], [False, False, True, True, True])
    np.testing.assert_allclose(b["rewards"], [5.23, 7.94, 10.65, 8.5, 5.0], rtol=1e-6)


def test_adjust_nstep_target_equals_sum_of_discounted_rewards_plus_bootstrap() -> None:
    """r_t^(n) + discount_t * V(new_obs_t) == the explicit n-step return for any V."""
    rng = np.random.default_rng(0)
    rewards = rng.standard_normal(9).astype(np.float32)
    values = rng.standard_normal(10).astype(np.float32)  # V(s_0..s_9)
    b = SampleBatch(obs=np.arange(9), new_obs=np.arange(1, 10), rewards=rewards, terminateds=np.zeros(9, bool))
    n = 4
    adjust_nstep(b, n, 0.95)
    for t in range(9):
        m = min(n, 9 - t)
        expected = sum(0.95**k * rewards[t + k] for k in range(m)) + 0.95**m * values[t + m]
        target = b["rewards"][t] + b[DISCOUNTS][t] * values[b["new_obs"][t]]
        assert target == pytest.approx(expected, rel=1e-4, abs=1e-4)


def test_adjust_nstep_n1_is_identity_on_rewards() -> None:
    b = adjust_nstep(five_steps(), 1, GAMMA)
    np.testing.assert_allclose(b["rewards"], [1, 2, 3, 4, 5])
    np.testing.assert_array_equal(b["new_obs"][:, 0], [1, 2, 3, 4, 5])
    np.testing.assert_allclose(b[DISCOUNTS], [0.9] * 5, rtol=1e-6)


def test_adjust_nstep_n_equal_to_length_plus_one() -> None:
    b = SampleBatch(new_obs=np.array([1, 2]), rewards=np.array([1.0, 2.0], np.float32), terminateds=[False, True])
    adjust_nstep(b, 3, GAMMA)
    np.testing.assert_allclose(b["rewards"], [2.8, 2.0], rtol=1e-6)
    np.testing.assert_array_equal(b["new_obs"], [2, 2])
    np.testing.assert_allclose(b[DISCOUNTS], [0.81, 0.9], rtol=1e-6)


@pytest.mark.parametrize("count,n_step", [(2, 4), (3, 5), (3, 10)])
def test_adjust_nstep_n_much_longer_than_piece(count: int, n_step: int) -> None:
    rewards = np.arange(1, count + 1, dtype=np.float32)
    b = SampleBatch(new_obs=np.arange(1, count + 1), rewards=rewards, terminateds=np.arange(count) == count - 1)
    adjust_nstep(b, n_step, GAMMA)
    expected = [sum(GAMMA**k * rewards[t + k] for k in range(count - t)) for t in range(count)]
    np.testing.assert_allclose(b["rewards"], expected, rtol=1e-6)
    np.testing.assert_array_equal(b["new_obs"], [count] * count)
    np.testing.assert_allclose(b[DISCOUNTS], [GAMMA ** (count - t) for t in range(count)], rtol=1e-6)


@pytest.mark.parametrize("n_step", [0, -1])
def test_adjust_nstep_rejects_n_below_one(n_step: int) -> None:
    with pytest.raises(ValueError, match="n_step"):
        adjust_nstep(five_steps(), n_step, GAMMA)
