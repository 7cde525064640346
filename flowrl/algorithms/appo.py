"""APPO: IMPALA's asynchronous plan with PPO's clipped surrogate on V-trace advantages.

The learner keeps a target network: the proximal policy that each update's probability
ratio is clipped around, and the policy V-trace corrects the behaviour data towards.
Plan: IMPALA's (train batches -> learner thread), and on the learner's results a target
network sync every ``target_update_frequency`` train batches and, with ``use_kl_loss``,
the adaptive KL coefficient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from flowrl.actors import WorkerSet
from flowrl.algorithms.impala import ImpalaConfig, batch_vtrace, start_learner, time_major, train_batches
from flowrl.algorithms.registry import Algorithm
from flowrl.config import cfg_field
from flowrl.data import SampleBatch
from flowrl.iterators import LocalIterator
from flowrl.operators import (
    KL_COEFF,
    Concurrently,
    Dequeue,
    Enqueue,
    StandardMetricsReporting,
    UpdateKL,
    UpdateTargetNetwork,
)
from flowrl.operators.learner_ops import record_learner_results
from flowrl.operators.names import NUM_LEARNER_UPDATES
from flowrl.policy import PolicySpec, TorchPolicy
from flowrl.policy.distributions import ActionDistribution


@dataclass(kw_only=True)
class APPOConfig(ImpalaConfig):
    """APPO settings: IMPALA's (see :class:`~flowrl.algorithms.impala.ImpalaConfig`) plus the PPO terms."""

    clip_param: float = cfg_field(0.4, "Clip the ratio to the target policy to [1 - clip_param, 1 + clip_param].", min=0, min_exclusive=True)
    num_sgd_iter: int = cfg_field(2, "Epochs the learner makes over each train batch (the ratio is clipped across them).", min=1)
    target_update_frequency: int = cfg_field(1, "Train batches learned between target network syncs.", min=1)
    use_kl_loss: bool = cfg_field(False, "Add a KL(target || policy) penalty with an adaptive coefficient.")
    kl_coeff: float = cfg_field(1.0, "Initial weight of the KL penalty (with use_kl_loss).", min=0)
    kl_target: float = cfg_field(0.01, "KL the coefficient is adapted towards.", min=0, min_exclusive=True)

    def policy_config(self) -> dict[str, Any]:
        return {**super().policy_config(), "clip_param": self.clip_param, "kl_target": self.kl_target}


def appo_loss(policy: TorchPolicy, model: nn.Module, dist_class: type[ActionDistribution], batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate (ratio to the target policy) on V-trace advantages + value loss + KL penalty - entropy."""
    config = policy.config
    horizon = int(config["rollout_fragment_length"])
    assert policy.target_model is not None
    logits, values = model(batch[SampleBatch.OBS])
    with torch.no_grad():
        _, next_values = model(batch[SampleBatch.NEW_OBS])
        target_logits, _ = policy.target_model(batch[SampleBatch.OBS])
    dist, target_dist = dist_class(logits), dist_class(target_logits)
    actions = batch[SampleBatch.ACTIONS]
    logp, target_logp = dist.logp(actions), target_dist.logp(actions)
    targets = batch_vtrace(config, batch, target_logp, values, next_values)
    advantages = targets.pg_advantages
    ratio = time_major(torch.exp(logp - target_logp), horizon)
    clip = config["clip_param"]
    surrogate = torch.min(advantages * ratio, advantages * torch.clamp(ratio, 1 - clip, 1 + clip)).mean()
    vf_loss = 0.5 * (time_major(values, horizon) - targets.vs).pow(2).mean()
    kl = target_dist.kl(dist).mean()
    entropy = dist.entropy().mean()
    kl_coeff = policy.coeffs[KL_COEFF]
    loss = -surrogate + config["vf_loss_coeff"] * vf_loss - config["entropy_coeff"] * entropy + kl_coeff * kl
    stats = {"policy_loss": -surrogate.item(), "vf_loss": vf_loss.item(), "entropy": entropy.item(), "kl": kl.item()}
    return loss, {**stats, KL_COEFF: kl_coeff}


def make_appo_policy(obs_space: gym.Space, action_space: gym.Space, config: APPOConfig) -> PolicySpec:
    """A TorchPolicy with the APPO loss, a target network, and the KL coefficient as state (0: no penalty)."""
    kwargs = {
        "loss_fn": appo_loss,
        "target_network": True,
        "coeffs": {KL_COEFF: config.kl_coeff if config.use_kl_loss else 0.0},
    }
    return PolicySpec(TorchPolicy, obs_space, action_space, config.policy_config(), kwargs)


def execution_plan(workers: WorkerSet, config: APPOConfig) -> LocalIterator[dict[str, Any]]:
    """IMPALA's train batches -> learner queue || learner results -> target sync -> KL update -> metrics."""
    learner = start_learner(workers, config)
    enqueue_op = train_batches(workers, config, learner).transform(Enqueue(learner.inqueue))
    sync_target = UpdateTargetNetwork(workers, config.target_update_frequency, counter=NUM_LEARNER_UPDATES, lock=learner.lock)
    dequeue_op = (
        Dequeue(learner.outqueue, check=learner.check)
        .for_each(record_learner_results)
        .for_each(sync_target)
        .for_each(UpdateKL(workers))
    )
    merged = Concurrently([enqueue_op, dequeue_op], mode="async", output_indexes=[1])
    return StandardMetricsReporting(merged, workers, config)


ALGORITHM = Algorithm("appo", "APPO: IMPALA with a clipped surrogate around a target network", APPOConfig, make_appo_policy, execution_plan)
