"""Per-trajectory postprocessing: discounted returns, GAE and n-step returns.

Each function takes the rows of ONE trajectory piece (one env, one episode or the part
of it in a fragment). Whether to bootstrap from the value function follows Gymnasium's
distinction: a piece whose last step ``terminated`` has no future (the return after it
is 0); one that was ``truncated`` or cut by the fragment boundary continues, so its last
next-observation's value stands in for the rest.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Protocol

import numpy as np

from flowrl.data import SampleBatch
from flowrl.policy.torch_policy import TorchPolicy


class AdvantageConfig(Protocol):
    """The keys :func:`actor_critic_postprocess` reads from a policy's config."""

    gamma: float
    lambda_: float
    use_gae: bool


class NStepConfig(Protocol):
    """The keys :func:`nstep_postprocess` reads from a policy's config."""

    gamma: float
    n_step: int


def discount_cumsum(x: np.ndarray, gamma: float) -> np.ndarray:
    """``y[t] = sum_k gamma**k * x[t + k]`` along the first axis."""
    values = np.asarray(x, dtype=np.float64).tolist()  # Python floats: a plain loop is fastest here
    running = 0.0
    for t in range(len(values) - 1, -1, -1):
        running = values[t] + gamma * running
        values[t] = running
    return np.asarray(values, dtype=np.float32)


def bootstrap_value(batch: SampleBatch, value_fn: Callable[[np.ndarray], np.ndarray]) -> float:
    """The value of the state after the piece: 0 if it terminated, else ``V(last new_obs)``."""
    if batch.count == 0 or bool(batch[SampleBatch.TERMINATEDS][-1]):
        return 0.0
    return float(value_fn(batch[SampleBatch.NEW_OBS][-1:])[0])


def compute_advantages(
    batch: SampleBatch,
    last_r: float,
    gamma: float = 0.99,
    lambda_: float = 1.0,
    use_gae: bool = True,
    use_critic: bool = True,
) -> SampleBatch:
    """Add ``advantages`` and ``value_targets`` to a trajectory piece (in place; returns it).

    With ``use_gae``: generalised advantage estimation over ``vf_preds`` (Schulman et
    al. 2016), targets = advantages + values. Without: discounted returns bootstrapped
    with ``last_r``; advantages subtract ``vf_preds`` when ``use_critic``.
    """
    rewards = batch[SampleBatch.REWARDS].astype(np.float32)
    if use_gae:
        values = np.append(batch[SampleBatch.VF_PREDS].astype(np.float32), np.float32(last_r))
        deltas = rewards + gamma * values[1:] - values[:-1]
        advantages = discount_cumsum(deltas, gamma * lambda_)
        targets = advantages + values[:-1]
    else:
        returns = discount_cumsum(np.append(rewards, np.float32(last_r)), gamma)[:-1]
        if use_critic:
            advantages = returns - batch[SampleBatch.VF_PREDS].astype(np.float32)
            targets = returns
        else:
            advantages, targets = returns, np.zeros_like(returns)
    batch[SampleBatch.ADVANTAGES] = advantages.astype(np.float32)
    batch[SampleBatch.VALUE_TARGETS] = targets.astype(np.float32)
    return batch


DISCOUNTS = "discounts"
"""Column written by :func:`adjust_nstep`: the factor ``gamma**k`` for bootstrapping each row."""


def adjust_nstep(batch: SampleBatch, n_step: int, gamma: float) -> SampleBatch:
    """Rewrite a trajectory piece into n-step transitions (in place; returns it).

    Row t's reward becomes ``sum_{k<m} gamma**k r[t+k]`` with ``m = min(n, steps left)``,
    its ``new_obs``/``terminateds``/``truncateds`` (and ``next_action_mask``) those of row ``t+m-1``, and the
    ``discounts`` column ``gamma**m`` (the factor for the bootstrapped value).
    """
    count = batch.count
    if n_step < 1:
        raise ValueError(f"n_step={n_step} must be >= 1")
    rewards = batch[SampleBatch.REWARDS].astype(np.float32)
    summed = np.zeros(count, dtype=np.float32)
    for k in range(min(n_step, count)):
        summed[: count - k] += (gamma**k) * rewards[k:]
    steps = np.minimum(n_step, count - np.arange(count))
    last = np.arange(count) + steps - 1
    batch[SampleBatch.REWARDS] = summed
    for key in (SampleBatch.NEW_OBS, SampleBatch.TERMINATEDS, SampleBatch.TRUNCATEDS, SampleBatch.NEXT_ACTION_MASK):
        if key in batch:
            batch[key] = batch[key][last]
    batch[DISCOUNTS] = (gamma**steps).astype(np.float32)
    return batch


def returns_postprocess(policy: TorchPolicy[Any], batch: SampleBatch) -> SampleBatch:
    """Each row's discounted return as ``value_targets``, bootstrapped from the policy's value of the
    piece's last next-observation unless it terminated (MARWIL's targets for recorded experiences)."""
    config: AdvantageConfig = policy.config
    last_r = bootstrap_value(batch, policy.value)
    returns = discount_cumsum(
        np.append(batch[SampleBatch.REWARDS].astype(np.float32), np.float32(last_r)), config.gamma
    )
    batch[SampleBatch.VALUE_TARGETS] = returns[:-1]
    return batch


def actor_critic_postprocess(policy: TorchPolicy[Any], batch: SampleBatch) -> SampleBatch:
    """Advantages and value targets of a trajectory piece (GAE, or returns minus the critic's
    values), bootstrapped from the critic unless the episode terminated (A2C, A3C, PPO); a recurrent
    policy's critic reads the state after the piece's last step (its ``state_out_*``)."""
    config: AdvantageConfig = policy.config
    value_fn = policy.value
    if policy.is_recurrent and batch.count:
        # The state after the piece's last step is that step's state_out; its action and reward come before.
        state = [batch[f"{SampleBatch.STATE_OUT}{k}"][-1:] for k in range(len(policy.get_initial_state()))]
        value_fn = functools.partial(
            policy.value,
            state=state,
            prev_actions=batch[SampleBatch.ACTIONS][-1:],
            prev_rewards=batch[SampleBatch.REWARDS][-1:],
        )
    last_r = bootstrap_value(batch, value_fn)
    return compute_advantages(batch, last_r, gamma=config.gamma, lambda_=config.lambda_, use_gae=config.use_gae)


def nstep_postprocess(policy: TorchPolicy[Any], batch: SampleBatch) -> SampleBatch:
    """``config.n_step``-step transitions with the bootstrap discount of each row (DQN, DDPG, TD3)."""
    config: NStepConfig = policy.config
    return adjust_nstep(batch, config.n_step, config.gamma)
