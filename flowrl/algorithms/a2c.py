"""Synchronous advantage actor-critic (A2C).

Plan: bulk-synchronous rollouts -> concatenate to ``train_batch_size`` -> one SGD step ->
broadcast weights. With ``microbatch_size`` the batch is built from microbatches whose
gradients are accumulated: ComputeGradients -> batch -> AverageGradients -> ApplyGradients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from flowrl.actors import PlanResources, WorkerSet
from flowrl.algorithms.registry import Algorithm
from flowrl.config import TrainerConfig, cfg_field
from flowrl.data import DEFAULT_POLICY_ID, SampleBatch
from flowrl.deferred import nn, torch
from flowrl.errors import ConfigError
from flowrl.iterators import LocalIterator
from flowrl.operators import (
    ApplyGradients,
    AverageGradients,
    ComputeGradients,
    ConcatBatches,
    ParallelRollouts,
    StandardMetricsReporting,
    TrainOneStep,
)
from flowrl.policy import LossOutput, PolicySpec, TorchPolicy, actor_critic_postprocess
from flowrl.policy.distributions import DistFactory


@dataclass(kw_only=True)
class A2CConfig(TrainerConfig):
    """Actor-critic settings (shared keys: see :class:`~flowrl.config.TrainerConfig`)."""

    learns_from_sequences = True

    defaults = {
        "rollout_fragment_length": 20,
        "num_envs_per_worker": 5,
        "train_batch_size": 500,
        "lr": 0.002,
        "grad_clip": 40.0,
    }
    # RLlib 2.2's A2C (rllib/algorithms/a2c/a2c.py over a3c/a3c.py), whose rollout_fragment_length
    # 'auto' RLlib's A2C tuned example uses; 1.13 had rollout_fragment_length 20 and train_batch_size 200.
    rllib_defaults = {
        "num_envs_per_worker": 1,
        "rollout_fragment_length": "auto",
        "train_batch_size": 32,
        "lr": 0.0001,
        "model": {"fcnet_hiddens": [256, 256], "vf_share_layers": True},
    }

    lambda_: float = cfg_field(
        1.0, "GAE lambda (1.0: discounted returns minus the value baseline).", min=0, max=1, per_policy=True
    )
    use_gae: bool = cfg_field(True, "Use generalised advantage estimation with the critic.", per_policy=True)
    vf_loss_coeff: float = cfg_field(0.5, "Weight of the value-function loss.", min=0, per_policy=True)
    entropy_coeff: float = cfg_field(0.01, "Weight of the entropy bonus.", min=0, per_policy=True)
    microbatch_size: int | None = cfg_field(
        None,
        "If set, accumulate gradients over microbatches of this many steps up to train_batch_size "
        "(whole fragments: a recurrent policy's sequences stay whole).",
        min=1,
    )

    def check(self) -> list[str]:
        problems = super().check()
        if self.microbatch_size is not None and self.microbatch_size > self.train_batch_size:
            problems.append(f"microbatch_size={self.microbatch_size} > train_batch_size={self.train_batch_size}")
        if self.microbatch_size is not None and self.num_learners >= 2:
            problems.append(
                f"microbatch_size={self.microbatch_size} accumulates gradients in the driver, but num_learners="
                f"{self.num_learners} learns in a learner group; leave microbatch_size unset"
            )
        return problems


def actor_critic_loss(
    policy: TorchPolicy[A2CConfig],
    model: nn.Module,
    dist_class: DistFactory,
    batch: dict[str, torch.Tensor],
) -> LossOutput:
    """Policy gradient on advantages + ``vf_loss_coeff`` * squared value error - ``entropy_coeff`` * entropy."""
    config = policy.config
    # A recurrent policy's batch comes in sequences: the outputs of their real steps, as rows.
    logits, values = policy.model_outputs(model, batch)
    assert values is not None, "the actor-critic loss needs a model with a value head"
    dist = dist_class(logits)
    policy_loss = -(dist.logp(batch[SampleBatch.ACTIONS]) * batch[SampleBatch.ADVANTAGES]).mean()
    vf_loss = 0.5 * (values - batch[SampleBatch.VALUE_TARGETS]).pow(2).mean()
    entropy = dist.entropy().mean()
    entropy_coeff = policy.scheduled("entropy_coeff")
    loss = policy_loss + config.vf_loss_coeff * vf_loss - entropy_coeff * entropy
    stats = {"policy_loss": policy_loss.item(), "vf_loss": vf_loss.item(), "entropy": entropy.item()}
    return LossOutput(loss, {**stats, "entropy_coeff": entropy_coeff})


def make_actor_critic_policy(obs_space: gym.Space[Any], action_space: gym.Space[Any], config: A2CConfig) -> PolicySpec:
    """A TorchPolicy with the actor-critic loss and GAE postprocessing."""
    kwargs = {"loss_fn": actor_critic_loss, "postprocess_fn": actor_critic_postprocess}
    return PolicySpec(TorchPolicy, obs_space, action_space, config, kwargs)


def execution_plan(workers: WorkerSet, config: A2CConfig, resources: PlanResources) -> LocalIterator[dict[str, Any]]:
    """Rollouts -> ConcatBatches -> TrainOneStep (or microbatched gradient accumulation) -> metrics."""
    rollouts = ParallelRollouts(workers, mode="bulk_sync")
    if config.microbatch_size is None:
        train_op = rollouts.combine(ConcatBatches(config.train_batch_size)).for_each(
            TrainOneStep(workers, resources=resources)
        )
    else:
        if workers.trainable_policies() != [DEFAULT_POLICY_ID]:
            raise ConfigError(
                [
                    f"microbatch_size={config.microbatch_size} accumulates the gradients of one policy, but this run "
                    f"trains {workers.trainable_policies()}; leave microbatch_size unset"
                ]
            )
        num_microbatches = math.ceil(config.train_batch_size / config.microbatch_size)
        train_op = (
            rollouts.combine(ConcatBatches(config.microbatch_size))
            .for_each(ComputeGradients(workers))
            .batch(num_microbatches)
            .for_each(AverageGradients())
            .for_each(ApplyGradients(workers))
        )
    return StandardMetricsReporting(train_op, workers, config)


ALGORITHM = Algorithm(
    "a2c",
    "synchronous advantage actor-critic",
    A2CConfig,
    make_actor_critic_policy,
    execution_plan,
    multi_agent=True,
    live_keys=frozenset({"lr", "entropy_coeff", "vf_loss_coeff"}),
    learner_group=True,
)
