"""Asynchronous advantage actor-critic (A3C): workers compute gradients, the driver applies them.

Plan: each rollout worker samples and computes the actor-critic gradients on its own
fragment -> the driver applies them as they arrive -> new weights go back to that worker only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flowrl.actors import PlanResources, WorkerSet
from flowrl.algorithms.a2c import A2CConfig, make_actor_critic_policy
from flowrl.algorithms.registry import Algorithm
from flowrl.config import cfg_field
from flowrl.iterators import LocalIterator
from flowrl.operators import ApplyGradients, AsyncGradients, StandardMetricsReporting


@dataclass(kw_only=True)
class A3CConfig(A2CConfig):
    """A3C settings: A2C's loss keys; each gradient comes from one worker's fragment, applied in the driver."""

    defaults = {"lr": 0.001}
    # RLlib 1.13's A3C (rllib/agents/a3c/a3c.py; 2.0-2.2 the same).
    rllib_defaults = {
        "num_envs_per_worker": 1,
        "rollout_fragment_length": 10,
        "lr": 0.0001,
        "model": {"fcnet_hiddens": [256, 256], "vf_share_layers": True},
    }

    num_workers: int = cfg_field(2, "Remote rollout workers computing gradients (at least 1).", min=1)


def execution_plan(workers: WorkerSet, config: A3CConfig, resources: PlanResources) -> LocalIterator[dict[str, Any]]:
    """AsyncGradients -> ApplyGradients(update_all=False) -> metrics."""
    train_op = AsyncGradients(workers).for_each(ApplyGradients(workers, update_all=False))
    return StandardMetricsReporting(train_op, workers, config)


# Workers compute A3C's gradients with their own copy of the loss coefficients: only lr (the
# driver's optimizer) is live.
ALGORITHM = Algorithm(
    "a3c",
    "asynchronous advantage actor-critic",
    A3CConfig,
    make_actor_critic_policy,
    execution_plan,
    live_keys=frozenset({"lr"}),
    asynchronous=True,
)
