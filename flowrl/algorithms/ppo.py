"""Proximal policy optimisation (PPO) with a clipped surrogate, GAE and an adaptive KL penalty.

Plan: bulk-synchronous rollouts -> concatenate to ``train_batch_size`` -> standardize
advantages -> ``num_sgd_iter`` epochs of ``sgd_minibatch_size`` minibatches -> broadcast
weights -> adapt the KL coefficient -> metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from flowrl.actors import PlanResources, WorkerSet
from flowrl.algorithms.registry import Algorithm
from flowrl.config import TrainerConfig, cfg_field
from flowrl.data import SampleBatch
from flowrl.deferred import nn, torch
from flowrl.iterators import LocalIterator
from flowrl.operators import (
    KL_COEFF,
    ConcatBatches,
    ParallelRollouts,
    StandardizeFields,
    StandardMetricsReporting,
    TrainOneStep,
    UpdateKL,
)
from flowrl.policy import LossOutput, PolicySpec, TorchPolicy, actor_critic_postprocess
from flowrl.policy.distributions import DistFactory


@dataclass(kw_only=True)
class PPOConfig(TrainerConfig):
    """PPO settings (shared keys: see :class:`~flowrl.config.TrainerConfig`)."""

    defaults = {"train_batch_size": 4000, "lr": 3e-4}
    learns_from_sequences = True
    # RLlib's PPO (rllib/agents/ppo/ppo.py in 1.13, rllib/algorithms/ppo/ppo.py in 2.0-2.2: the same values).
    rllib_defaults = {
        "lr": 5e-5,
        "num_sgd_iter": 30,
        "lambda_": 1.0,
        "clip_param": 0.3,
        "vf_loss_coeff": 1.0,
        "model": {"fcnet_hiddens": [256, 256]},
    }

    sgd_minibatch_size: int = cfg_field(128, "Env steps per SGD minibatch.", min=1)
    num_sgd_iter: int = cfg_field(10, "Epochs over each train batch.", min=1)
    lambda_: float = cfg_field(0.95, "GAE lambda.", min=0, max=1, per_policy=True)
    use_gae: bool = cfg_field(
        True, "Use generalised advantage estimation (else returns minus values).", per_policy=True
    )
    clip_param: float = cfg_field(
        0.2,
        "Clip the probability ratio to [1 - clip_param, 1 + clip_param].",
        min=0,
        min_exclusive=True,
        per_policy=True,
    )
    vf_clip_param: float = cfg_field(
        10.0, "Clip value updates to this distance from the sampled values.", min=0, min_exclusive=True, per_policy=True
    )
    vf_loss_coeff: float = cfg_field(0.5, "Weight of the value-function loss.", min=0, per_policy=True)
    entropy_coeff: float = cfg_field(0.0, "Weight of the entropy bonus.", min=0, per_policy=True)
    kl_coeff: float = cfg_field(
        0.2, "Initial weight of the KL penalty (adapted towards kl_target; 0 disables it).", min=0, per_policy=True
    )
    kl_target: float = cfg_field(
        0.01,
        "KL divergence per SGD pass the KL coefficient is adapted towards.",
        min=0,
        min_exclusive=True,
        per_policy=True,
    )

    def check(self) -> list[str]:
        problems = super().check()
        if self.sgd_minibatch_size > self.train_batch_size:
            problems.append(f"sgd_minibatch_size={self.sgd_minibatch_size} > train_batch_size={self.train_batch_size}")
        return problems


def ppo_loss(
    policy: TorchPolicy[PPOConfig],
    model: nn.Module,
    dist_class: DistFactory,
    batch: dict[str, torch.Tensor],
) -> LossOutput:
    """Clipped surrogate + KL penalty + clipped value loss - entropy bonus (Schulman et al. 2017)."""
    config = policy.config
    # A recurrent policy's batch comes in sequences: the outputs of their real steps, as rows.
    logits, values = policy.model_outputs(model, batch)
    assert values is not None, "PPO's models have a value head"
    dist = dist_class(logits)
    old_dist = dist_class(batch[SampleBatch.ACTION_DIST_INPUTS])
    advantages = batch[SampleBatch.ADVANTAGES]
    ratio = torch.exp(dist.logp(batch[SampleBatch.ACTIONS]) - batch[SampleBatch.ACTION_LOGP])
    clip = config.clip_param
    surrogate = torch.min(advantages * ratio, advantages * torch.clamp(ratio, 1 - clip, 1 + clip)).mean()
    kl_coeff = policy.coeffs[KL_COEFF]
    # A term whose coefficient is 0 is computed for its statistic only, outside the graph: its share
    # of the gradient is zero, and its backward pass would cost as much as the surrogate's.
    grad = torch.is_grad_enabled()
    with torch.set_grad_enabled(grad and bool(kl_coeff)):
        kl = old_dist.kl(dist).mean()
    old_values = batch[SampleBatch.VF_PREDS]
    clipped_values = old_values + torch.clamp(values - old_values, -config.vf_clip_param, config.vf_clip_param)
    targets = batch[SampleBatch.VALUE_TARGETS]
    vf_loss = torch.max((values - targets).pow(2), (clipped_values - targets).pow(2)).mean()
    entropy_coeff = policy.scheduled("entropy_coeff")
    with torch.set_grad_enabled(grad and bool(entropy_coeff)):
        entropy = dist.entropy().mean()
    loss = -surrogate
    if kl_coeff:
        loss = loss + kl_coeff * kl
    loss = loss + config.vf_loss_coeff * vf_loss
    if entropy_coeff:
        loss = loss - entropy_coeff * entropy
    # One conversion for the four statistics, not one .item() each.
    policy_loss, vf, mean_kl, mean_entropy = torch.stack([-surrogate, vf_loss, kl, entropy]).detach().tolist()
    stats = {"policy_loss": policy_loss, "vf_loss": vf, "kl": mean_kl, "entropy": mean_entropy}
    return LossOutput(loss, {**stats, KL_COEFF: kl_coeff, "entropy_coeff": entropy_coeff})


def make_ppo_policy(obs_space: gym.Space[Any], action_space: gym.Space[Any], config: PPOConfig) -> PolicySpec:
    """A TorchPolicy with the PPO loss, GAE postprocessing and the KL coefficient as state."""
    kwargs = {"loss_fn": ppo_loss, "postprocess_fn": actor_critic_postprocess, "coeffs": {KL_COEFF: config.kl_coeff}}
    return PolicySpec(TorchPolicy, obs_space, action_space, config, kwargs)


def training_flow(
    rollouts: LocalIterator[Any],
    workers: WorkerSet,
    config: PPOConfig,
    resources: PlanResources,
    policies: Sequence[str] | None = None,
) -> LocalIterator[Any]:
    """PPO's learning from a stream of rollouts: ConcatBatches -> StandardizeFields -> TrainOneStep
    (the config's minibatch epochs, in the learner group of ``resources`` if they hold one; only
    ``policies``, default all trainable) -> UpdateKL. A building block of composed plans (``ppo_dqn``)."""
    return (
        rollouts.combine(ConcatBatches(config.train_batch_size))
        .for_each(StandardizeFields([SampleBatch.ADVANTAGES]))
        .for_each(TrainOneStep(workers, policies, config, resources=resources))
        .for_each(UpdateKL(workers))
    )


def execution_plan(workers: WorkerSet, config: PPOConfig, resources: PlanResources) -> LocalIterator[dict[str, Any]]:
    """Rollouts -> ConcatBatches -> StandardizeFields -> TrainOneStep (minibatch epochs) -> UpdateKL -> metrics."""
    rollouts = ParallelRollouts(workers, mode="bulk_sync")
    return StandardMetricsReporting(training_flow(rollouts, workers, config, resources), workers, config)


ALGORITHM = Algorithm(
    "ppo",
    "proximal policy optimisation",
    PPOConfig,
    make_ppo_policy,
    execution_plan,
    multi_agent=True,
    live_keys=frozenset({"lr", "entropy_coeff", "clip_param", "vf_loss_coeff"}),
    learner_group=True,
)
