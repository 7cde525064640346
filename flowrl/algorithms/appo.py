"""APPO: IMPALA's asynchronous plan with PPO's clipped surrogate on V-trace advantages.

The learner keeps a target network: the proximal policy that each update's probability
ratio is clipped around, and the policy V-trace corrects the behaviour data towards.
Plan: IMPALA's (train batches -> learner thread), and on the learner's results a target
network sync every ``target_update_frequency`` train batches and, with ``use_kl_loss``,
the adaptive KL coefficient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym

from flowrl.actors import PlanResources, WorkerSet
from flowrl.algorithms import impala
from flowrl.algorithms.registry import Algorithm
from flowrl.config import cfg_field
from flowrl.data import SampleBatch
from flowrl.deferred import nn, torch
from flowrl.iterators import LocalIterator
from flowrl.operators import (
    KL_COEFF,
    NUM_LEARNER_UPDATES,
    Concurrently,
    StandardMetricsReporting,
    UpdateKL,
    UpdateTargetNetwork,
)
from flowrl.policy import LossOutput, PolicySpec, TorchPolicy
from flowrl.policy.distributions import DistFactory
from flowrl.policy.vtrace import batch_vtrace, fragment_outputs, time_major


@dataclass(kw_only=True)
class APPOConfig(impala.ImpalaConfig):
    """APPO settings: IMPALA's (see :class:`~flowrl.algorithms.impala.ImpalaConfig`) plus the PPO terms.

    ``num_sgd_iter`` epochs over each train batch clip the ratio to the target policy across them.
    """

    defaults = {"num_sgd_iter": 2}
    # RLlib 1.13's APPO (rllib/agents/ppo/appo.py over IMPALA's; 2.0-2.2 the same).
    rllib_defaults = {
        "num_envs_per_worker": 1,
        "train_batch_size": 500,
        "num_sgd_iter": 1,
        "model": {"fcnet_hiddens": [256, 256], "vf_share_layers": True},
    }

    clip_param: float = cfg_field(
        0.4,
        "Clip the ratio to the target policy to [1 - clip_param, 1 + clip_param].",
        min=0,
        min_exclusive=True,
        per_policy=True,
    )
    target_update_frequency: int = cfg_field(1, "Train batches learned between target network syncs.", min=1)
    use_kl_loss: bool = cfg_field(
        False, "Add a KL(target || policy) penalty with an adaptive coefficient.", per_policy=True
    )
    kl_coeff: float = cfg_field(1.0, "Initial weight of the KL penalty (with use_kl_loss).", min=0, per_policy=True)
    kl_target: float = cfg_field(
        0.01, "KL the coefficient is adapted towards.", min=0, min_exclusive=True, per_policy=True
    )

    #: What ``target_update_frequency`` counts, for ``UpdateTargetNetwork``: train batches learned.
    target_update_counter: ClassVar[str] = NUM_LEARNER_UPDATES

    @property
    def target_network_update_freq(self) -> int:
        """``target_update_frequency``, under the name ``UpdateTargetNetwork`` reads."""
        return self.target_update_frequency

    @property
    def tau(self) -> float:
        """APPO's target network is a copy of the network (``UpdateTargetNetwork`` reads this)."""
        return 1.0


def appo_loss(
    policy: TorchPolicy[APPOConfig],
    model: nn.Module,
    dist_class: DistFactory,
    batch: dict[str, torch.Tensor],
) -> LossOutput:
    """Clipped surrogate (ratio to the target policy) on V-trace advantages + value loss + KL penalty - entropy."""
    config = policy.config
    horizon = config.rollout_fragment_length
    assert policy.target_model is not None
    logits, values, next_values = fragment_outputs(policy, model, batch, horizon)
    with torch.no_grad():  # the target model reads a recurrent policy's sequences as the model does
        target_logits, _ = policy.model_outputs(policy.target_model, batch)
    dist, target_dist = dist_class(logits), dist_class(target_logits)
    actions = batch[SampleBatch.ACTIONS]
    logp, target_logp = dist.logp(actions), target_dist.logp(actions)
    targets = batch_vtrace(config, batch, target_logp, values, next_values)
    advantages = targets.pg_advantages
    ratio = time_major(torch.exp(logp - target_logp), horizon)
    clip = config.clip_param
    surrogate = torch.min(advantages * ratio, advantages * torch.clamp(ratio, 1 - clip, 1 + clip)).mean()
    vf_loss = 0.5 * (time_major(values, horizon) - targets.vs).pow(2).mean()
    kl = target_dist.kl(dist).mean()
    entropy = dist.entropy().mean()
    kl_coeff, entropy_coeff = policy.coeffs[KL_COEFF], policy.scheduled("entropy_coeff")
    loss = -surrogate + config.vf_loss_coeff * vf_loss - entropy_coeff * entropy + kl_coeff * kl
    stats = {"policy_loss": -surrogate.item(), "vf_loss": vf_loss.item(), "entropy": entropy.item(), "kl": kl.item()}
    return LossOutput(loss, {**stats, KL_COEFF: kl_coeff, "entropy_coeff": entropy_coeff})


def make_appo_policy(obs_space: gym.Space[Any], action_space: gym.Space[Any], config: APPOConfig) -> PolicySpec:
    """A TorchPolicy with the APPO loss, a target network, and the KL coefficient as state (0: no penalty)."""
    kwargs = {
        "loss_fn": appo_loss,
        "target_network": True,
        "coeffs": {KL_COEFF: config.kl_coeff if config.use_kl_loss else 0.0},
    }
    return PolicySpec(TorchPolicy, obs_space, action_space, config, kwargs)


def execution_plan(workers: WorkerSet, config: APPOConfig, resources: PlanResources) -> LocalIterator[dict[str, Any]]:
    """IMPALA's train batches -> learner queue || learner results -> target sync -> KL update -> metrics."""
    enqueue_op, learned = impala.learning_flows(workers, config, resources)
    sync_target = UpdateTargetNetwork(workers, config, resources=resources)
    merged = Concurrently(
        [enqueue_op, learned.for_each(sync_target).for_each(UpdateKL(workers))], mode="async", output_indexes=[1]
    )
    return StandardMetricsReporting(merged, workers, config)


ALGORITHM = Algorithm(
    "appo",
    "APPO: IMPALA with a clipped surrogate around a target network",
    APPOConfig,
    make_appo_policy,
    execution_plan,
    make_resources=impala.make_resources,
    bundles=impala.bundles,
    live_keys=frozenset({"lr", "entropy_coeff", "clip_param", "vf_loss_coeff"}),
    asynchronous=True,
    learner_group=True,
)
