"""Evolution Strategies (Salimans et al. 2017): a gradient estimate from antithetic weight perturbations.

Plan: synchronous rounds of antithetic pairs on the rollout workers (noise indices and
returns come back, never parameters) -> gather ``episodes_per_batch`` episodes and
``train_batch_size`` of their steps -> centered-rank fitness shaping and one Adam (or SGD)
step in the driver -> merge the observation filter -> broadcast weights -> metrics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import gymnasium as gym
import numpy as np

from flowrl.actors import PlanResources, WorkerSet
from flowrl.actors.perturbation import NoiseTable, PerturbationResult
from flowrl.algorithms.perturbation_config import PerturbationConfig
from flowrl.algorithms.registry import Algorithm
from flowrl.config import cfg_field
from flowrl.deferred import torch
from flowrl.iterators import LocalIterator
from flowrl.operators import (
    PerturbationSearch,
    PerturbationUpdate,
    SearchRounds,
    StandardMetricsReporting,
    centered_ranks,
)
from flowrl.policy import PolicySpec, TorchPolicy
from flowrl.policy.perturbation_spec import perturbation_policy_spec


@dataclass(kw_only=True)
class ESConfig(PerturbationConfig):
    """ES settings (shared keys: :class:`~flowrl.algorithms.perturbation_config.PerturbationConfig`).

    The policy network is ``model``'s MLP (``fcnet_hiddens: []``: linear).
    """

    defaults = {"model": {"fcnet_hiddens": [32, 32]}}
    # RLlib 1.13's ES (rllib/agents/es/es.py; 2.2 the same). Its 10 workers and 250M-float noise table
    # size the run to a machine, its eval_prob only what is reported: not taken.
    rllib_defaults = {"episodes_per_batch": 1000, "train_batch_size": 10_000, "model": {"fcnet_hiddens": [256, 256]}}

    episodes_per_batch: int = cfg_field(
        100,
        "Perturbed episodes (2 per antithetic pair) per update, at least; a round asks the workers for this many.",
        min=2,
    )
    train_batch_size: int = cfg_field(
        1000,
        "Env steps of perturbed episodes per update, at least (more rounds are run until both minimums are met).",
        min=1,
    )
    stepsize: float = cfg_field(
        0.01,
        "Step size (learning rate) of the optimizer applying the ES gradient.",
        min=0,
        min_exclusive=True,
        per_policy=True,
    )
    optimizer: Literal["adam", "sgd"] = cfg_field(
        "adam", "Optimizer of the update: 'adam' or 'sgd' (with sgd_momentum).", per_policy=True
    )
    sgd_momentum: float = cfg_field(0.9, "Momentum of the 'sgd' optimizer.", min=0, max=1, per_policy=True)
    l2_coeff: float = cfg_field(0.005, "L2 weight decay: l2_coeff * theta is subtracted from the ES gradient.", min=0)


def make_es_optimizer(policy: TorchPolicy[ESConfig]) -> torch.optim.Optimizer:
    """Adam or SGD with momentum over the model's parameters, at ``stepsize``."""
    config = policy.config
    if config.optimizer == "sgd":
        return torch.optim.SGD(policy.model.parameters(), lr=config.stepsize, momentum=config.sgd_momentum)
    return torch.optim.Adam(policy.model.parameters(), lr=config.stepsize)


def make_es_policy(obs_space: gym.Space[Any], action_space: gym.Space[Any], config: ESConfig) -> PolicySpec:
    """A deterministic TorchPolicy over a perturbable MLP, stepped by the ES optimizer."""
    return perturbation_policy_spec(obs_space, action_space, config, make_es_optimizer)


def es_gradient(result: PerturbationResult, noise: NoiseTable, dim: int, noise_stdev: float) -> np.ndarray:
    """The ES estimate of the gradient of the expected (rank-shaped) return.

    ``sum_i (F(theta + sigma eps_i) - F(theta - sigma eps_i)) eps_i / (2 n sigma)`` with the
    returns replaced by their centered ranks over all ``2n`` episodes.
    """
    ranks = centered_ranks(result.returns)
    weights = ranks[:, 0] - ranks[:, 1]
    return noise.weighted_sum(weights, result.noise_indices, dim) / (result.returns.size * noise_stdev)


class ESUpdate(PerturbationUpdate):
    """One optimizer step of the local worker's policy along the ES gradient, with L2 decay (pass-through)."""

    def __init__(self, workers: WorkerSet, noise: NoiseTable, config: ESConfig) -> None:
        super().__init__(workers, noise, config.l2_coeff)
        self.noise_stdev = config.noise_stdev

    def estimate(self, result: PerturbationResult) -> tuple[np.ndarray, PerturbationResult, dict[str, float]]:
        gradient = es_gradient(result, self.noise, self.dim, self.noise_stdev)
        return gradient, result, {"gradient_norm": float(np.linalg.norm(gradient))}


def execution_plan(workers: WorkerSet, config: ESConfig, resources: PlanResources) -> LocalIterator[dict[str, Any]]:
    """Perturbation rounds -> CollectPerturbations -> ESUpdate -> observation filter -> BroadcastWeights -> metrics."""
    rounds = SearchRounds(
        pairs_per_round=math.ceil(config.episodes_per_batch / 2),
        min_episodes=config.episodes_per_batch,
        min_steps=config.train_batch_size,
    )
    search = PerturbationSearch(workers, config, ESUpdate, rounds)
    return StandardMetricsReporting(search, workers, config)


ALGORITHM = Algorithm(
    "es", "evolution strategies (antithetic perturbations, centered ranks)", ESConfig, make_es_policy, execution_plan
)
