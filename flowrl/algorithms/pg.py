"""Vanilla policy gradient (REINFORCE): ascend log-probability weighted by the discounted return.

Plan: bulk-synchronous rollouts -> concatenate to ``train_batch_size`` -> one SGD step on
the local worker -> broadcast weights -> metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from flowrl.actors import PlanResources, WorkerSet
from flowrl.algorithms.registry import Algorithm
from flowrl.config import TrainerConfig
from flowrl.data import SampleBatch
from flowrl.deferred import nn, torch
from flowrl.iterators import LocalIterator
from flowrl.operators import ConcatBatches, ParallelRollouts, StandardMetricsReporting, TrainOneStep
from flowrl.policy import LossOutput, PolicySpec, TorchPolicy, compute_advantages
from flowrl.policy.custom_model import POLICY
from flowrl.policy.distributions import DistFactory


@dataclass(kw_only=True)
class PGConfig(TrainerConfig):
    """Policy gradient settings (shared keys: see :class:`~flowrl.config.TrainerConfig`).

    ``train_batch_size`` env steps make one gradient step per iteration.
    """

    defaults = {"train_batch_size": 1000, "lr": 0.004}
    learns_from_sequences = True
    # RLlib 1.13's PG (rllib/agents/pg/pg.py with the common config; 2.0-2.2 the same).
    rllib_defaults = {"train_batch_size": 200, "lr": 0.0004, "model": {"fcnet_hiddens": [256, 256]}}


def pg_loss(
    policy: TorchPolicy[PGConfig],
    model: nn.Module,
    dist_class: DistFactory,
    batch: dict[str, torch.Tensor],
) -> LossOutput:
    """``-mean(log pi(a|s) * G)`` where G is the discounted return from each step."""
    logits, _ = policy.model_outputs(model, batch)  # a recurrent policy's sequences: their real steps
    logp = dist_class(logits).logp(batch[SampleBatch.ACTIONS])
    loss = -(logp * batch[SampleBatch.ADVANTAGES]).mean()
    return LossOutput(loss, {"policy_loss": loss.item()})


def pg_postprocess(policy: TorchPolicy[PGConfig], batch: SampleBatch) -> SampleBatch:
    """Discounted returns; a trajectory cut before its end is not bootstrapped (no critic)."""
    return compute_advantages(batch, 0.0, gamma=policy.config.gamma, use_gae=False, use_critic=False)


def _policy_model(
    obs_space: gym.Space[Any], action_space: gym.Space[Any], num_outputs: int, model_config: Any
) -> nn.Module:
    from flowrl.policy.models import ActorCriticModel  # torch modules: imported when a policy is built

    return ActorCriticModel(obs_space, num_outputs, model_config, value_head=False)


def make_pg_policy(obs_space: gym.Space[Any], action_space: gym.Space[Any], config: PGConfig) -> PolicySpec:
    """A TorchPolicy with the PG loss and return postprocessing; the policy model has no value head,
    except the recurrent one (``model.use_lstm``), whose value head the loss leaves untrained."""
    kwargs: dict[str, Any] = {"loss_fn": pg_loss, "postprocess_fn": pg_postprocess, "model_interface": POLICY}
    if not config.model.get("use_lstm"):
        kwargs["make_model"] = _policy_model
    return PolicySpec(TorchPolicy, obs_space, action_space, config, kwargs)


def execution_plan(workers: WorkerSet, config: PGConfig, resources: PlanResources) -> LocalIterator[dict[str, Any]]:
    """Rollouts -> ConcatBatches -> TrainOneStep -> metrics."""
    rollouts = ParallelRollouts(workers, mode="bulk_sync")
    train_op = rollouts.combine(ConcatBatches(config.train_batch_size)).for_each(
        TrainOneStep(workers, resources=resources)
    )
    return StandardMetricsReporting(train_op, workers, config)


ALGORITHM = Algorithm(
    "pg",
    "vanilla policy gradient (REINFORCE)",
    PGConfig,
    make_pg_policy,
    execution_plan,
    multi_agent=True,
    live_keys=frozenset({"lr"}),
    learner_group=True,
)
