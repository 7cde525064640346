"""V-trace against a straightforward reference computation, and its on-policy limit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flowrl.policy.vtrace import vtrace

pytestmark = pytest.mark.unit

GAMMA = 0.9


def random_trajectories(T: int, B: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    terminated = rng.random((T, B)) < 0.1
    truncated = (rng.random((T, B)) < 0.1) & ~terminated
    return {
        "log_rhos": rng.normal(0.0, 0.8, (T, B)),
        "rewards": rng.normal(0.0, 1.0, (T, B)),
        "values": rng.normal(0.0, 1.0, (T, B)),
        "next_values": rng.normal(0.0, 1.0, (T, B)),
        "terminated": terminated,
        "truncated": truncated,
    }


def reference(
    d: dict[str, np.ndarray], rho_bar: float, pg_rho_bar: float, c_bar: float
) -> tuple[np.ndarray, np.ndarray]:
    """Element by element, straight from the paper: v_s = V(x_s) + sum_t gamma^(t-s) (prod c_i) delta_t."""
    T, B = d["rewards"].shape
    vs = np.zeros((T, B))
    adv = np.zeros((T, B))
    for b in range(B):
        for s in range(T):
            total, weight, t = 0.0, 1.0, s
            while True:
                rho = np.exp(d["log_rhos"][t, b])
                discount = 0.0 if d["terminated"][t, b] else GAMMA
                delta = min(rho_bar, rho) * (d["rewards"][t, b] + discount * d["next_values"][t, b] - d["values"][t, b])
                total += weight * delta
                if d["terminated"][t, b] or d["truncated"][t, b] or t == T - 1:
                    break
                weight *= discount * min(c_bar, rho)
                t += 1
            vs[s, b] = d["values"][s, b] + total
    for b in range(B):
        for s in range(T):
            discount = 0.0 if d["terminated"][s, b] else GAMMA
            ends = d["terminated"][s, b] or d["truncated"][s, b] or s == T - 1
            next_v = d["next_values"][s, b] if ends else vs[s + 1, b]
            rho = np.exp(d["log_rhos"][s, b])
            adv[s, b] = min(pg_rho_bar, rho) * (d["rewards"][s, b] + discount * next_v - d["values"][s, b])
    return vs, adv


def run(d: dict[str, np.ndarray], **thresholds: float) -> tuple[np.ndarray, np.ndarray]:
    t = {k: torch.as_tensor(v, dtype=torch.float64) for k, v in d.items()}
    discounts = GAMMA * (1.0 - t["terminated"])
    continues = 1.0 - torch.maximum(t["terminated"], t["truncated"])
    out = vtrace(t["log_rhos"], discounts, t["rewards"], t["values"], t["next_values"], continues, **thresholds)
    return out.vs.numpy(), out.pg_advantages.numpy()


@pytest.mark.parametrize(("rho_bar", "pg_rho_bar", "c_bar"), [(1.0, 1.0, 1.0), (0.5, 2.0, 0.8), (10.0, 10.0, 10.0)])
def test_matches_the_reference_with_clipping_and_episode_ends(rho_bar: float, pg_rho_bar: float, c_bar: float) -> None:
    d = random_trajectories(T=20, B=5, seed=int(rho_bar * 10))
    assert d["terminated"].any() and d["truncated"].any()
    vs, adv = run(d, clip_rho_threshold=rho_bar, clip_pg_rho_threshold=pg_rho_bar, clip_c_threshold=c_bar)
    ref_vs, ref_adv = reference(d, rho_bar, pg_rho_bar, c_bar)
    np.testing.assert_allclose(vs, ref_vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-10, atol=1e-10)


def test_on_policy_targets_are_bootstrapped_n_step_returns() -> None:
    d = random_trajectories(T=15, B=4, seed=1)
    d["log_rhos"] = np.zeros_like(d["log_rhos"])  # behaviour policy = target policy
    # Within an episode the next step's observation is the next row's: the same value.
    goes_on = ~(d["terminated"] | d["truncated"])
    d["next_values"][:-1][goes_on[:-1]] = d["values"][1:][goes_on[:-1]]
    vs, _ = run(d)
    T, B = d["rewards"].shape
    for b in range(B):
        for s in range(T):
            ret, discount_so_far, t = 0.0, 1.0, s
            while True:
                ret += discount_so_far * d["rewards"][t, b]
                if d["terminated"][t, b]:
                    break
                if d["truncated"][t, b] or t == T - 1:
                    ret += discount_so_far * GAMMA * d["next_values"][t, b]
                    break
                discount_so_far *= GAMMA
                t += 1
            assert vs[s, b] == pytest.approx(ret, rel=1e-10, abs=1e-10)
