"""Augmented Random Search, V2-t (Mania et al. 2018): a random-search step over the best directions.

Plan: synchronous rounds of ``num_rollouts`` antithetic directions on the rollout workers
(noise indices, returns and observation statistics come back) -> the top ``rollouts_used``
directions by ``max(r+, r-)`` give the step ``sgd_stepsize / (b * sigma_R) * sum (r+ - r-)
eps`` -> merge the observation statistics into the policy's filter -> broadcast weights ->
metrics. The policy is linear by default (``model: {fcnet_hiddens: []}``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from flowrl.actors import PlanResources, WorkerSet
from flowrl.actors.perturbation import NoiseTable, PerturbationResult
from flowrl.algorithms.perturbation_config import PerturbationConfig
from flowrl.algorithms.registry import Algorithm
from flowrl.config import cfg_field
from flowrl.deferred import torch
from flowrl.iterators import LocalIterator
from flowrl.operators import PerturbationSearch, PerturbationUpdate, SearchRounds, StandardMetricsReporting
from flowrl.policy import PolicySpec, TorchPolicy
from flowrl.policy.perturbation_spec import perturbation_policy_spec


@dataclass(kw_only=True)
class ARSConfig(PerturbationConfig):
    """ARS settings (shared keys: :class:`~flowrl.algorithms.perturbation_config.PerturbationConfig`).

    ``noise_stdev`` is nu, the std of the parameter perturbations theta +- nu * eps; the
    default ``model`` (no hidden layers) is ARS's linear policy.
    """

    defaults = {"noise_stdev": 0.03, "model": {"fcnet_hiddens": []}}
    # RLlib 1.13's ARS (rllib/agents/ars/ars.py; 2.2 the same): RLlib's model defaults, not a linear policy.
    rllib_defaults = {
        "noise_stdev": 0.02,
        "rollouts_used": 32,
        "sgd_stepsize": 0.01,
        "model": {"fcnet_hiddens": [256, 256]},
    }

    num_rollouts: int = cfg_field(32, "N: antithetic directions evaluated per update (2 episodes each).", min=1)
    rollouts_used: int = cfg_field(16, "b: directions with the highest max(r+, r-) that make the step (b <= N).", min=1)
    sgd_stepsize: float = cfg_field(0.02, "alpha: step size of the update.", min=0, min_exclusive=True, per_policy=True)

    def check(self) -> list[str]:
        problems = super().check()
        if self.rollouts_used > self.num_rollouts:
            problems.append(f"rollouts_used={self.rollouts_used} > num_rollouts={self.num_rollouts}")
        return problems


def make_ars_optimizer(policy: TorchPolicy[ARSConfig]) -> torch.optim.Optimizer:
    """Plain SGD at ``sgd_stepsize``: the ARS step is the search direction times the step size."""
    return torch.optim.SGD(policy.model.parameters(), lr=policy.config.sgd_stepsize)


def make_ars_policy(obs_space: gym.Space[Any], action_space: gym.Space[Any], config: ARSConfig) -> PolicySpec:
    """A deterministic TorchPolicy over a perturbable (by default linear) model starting at zero."""
    return perturbation_policy_spec(obs_space, action_space, config, make_ars_optimizer, zero_init=True)


def ars_direction(
    result: PerturbationResult, noise: NoiseTable, dim: int, rollouts_used: int
) -> tuple[np.ndarray, float]:
    """The ARS search direction (before the step size) and sigma_R, the std of the returns it used.

    Keeps the ``rollouts_used`` pairs with the highest ``max(r+, r-)`` and returns
    ``sum_k (r+_k - r-_k) eps_k / (b * sigma_R)``.
    """
    returns = result.returns
    top = np.argsort(-returns.max(axis=1), kind="stable")[:rollouts_used]
    used = returns[top]
    sigma_r = float(used.std())
    # All 2b returns equal: every difference is 0 and so is the direction.
    scale = rollouts_used * (sigma_r if sigma_r > 0 else 1.0)
    return noise.weighted_sum(used[:, 0] - used[:, 1], result.noise_indices[top], dim) / scale, sigma_r


class ARSUpdate(PerturbationUpdate):
    """One ARS step of the local worker's policy from the first ``num_rollouts`` pairs (pass-through)."""

    def __init__(self, workers: WorkerSet, noise: NoiseTable, config: ARSConfig) -> None:
        super().__init__(workers, noise)
        self.num_rollouts = config.num_rollouts
        self.rollouts_used = config.rollouts_used

    def estimate(self, result: PerturbationResult) -> tuple[np.ndarray, PerturbationResult, dict[str, float]]:
        used = result.take(self.num_rollouts)
        direction, sigma_r = ars_direction(used, self.noise, self.dim, self.rollouts_used)
        return direction, used, {"reward_std": sigma_r}


def execution_plan(workers: WorkerSet, config: ARSConfig, resources: PlanResources) -> LocalIterator[dict[str, Any]]:
    """Perturbation rounds -> CollectPerturbations (N pairs) -> ARSUpdate -> observation filter ->
    BroadcastWeights -> metrics."""
    rounds = SearchRounds(pairs_per_round=config.num_rollouts, min_episodes=2 * config.num_rollouts)
    search = PerturbationSearch(workers, config, ARSUpdate, rounds)
    return StandardMetricsReporting(search, workers, config)


ALGORITHM = Algorithm(
    "ars", "augmented random search (V2-t, linear policy)", ARSConfig, make_ars_policy, execution_plan
)
