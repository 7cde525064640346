"""IMPALA: asynchronous actor-learner training with V-trace off-policy corrections (Espeholt et al. 2018).

Plan: async rollouts (weights sent back to a worker once the learner has made
``broadcast_interval`` updates since its last) -> ConcatBatches -> the learner thread's
queue; the learner's results drive the counters and the iterations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from flowrl.actors import LearnerThread, WorkerSet
from flowrl.algorithms.registry import Algorithm
from flowrl.config import TrainerConfig, cfg_field
from flowrl.data import SampleBatch
from flowrl.iterators import LocalIterator
from flowrl.operators import (
    ConcatBatches,
    Concurrently,
    Dequeue,
    Enqueue,
    ParallelRollouts,
    StandardMetricsReporting,
)
from flowrl.operators.learner_ops import SendWeightsToSource, record_learner_results
from flowrl.policy import PolicySpec, TorchPolicy
from flowrl.policy.distributions import ActionDistribution
from flowrl.policy.vtrace import vtrace


@dataclass(kw_only=True)
class ImpalaConfig(TrainerConfig):
    """IMPALA settings (shared keys: see :class:`~flowrl.config.TrainerConfig`)."""

    num_workers: int = cfg_field(2, "Remote rollout workers (at least 1).", min=1)
    num_envs_per_worker: int = cfg_field(8, "Vectorized envs per rollout worker.", min=1)
    rollout_fragment_length: int = cfg_field(50, "Env steps per env per fragment (the V-trace horizon).", min=1)
    train_batch_size: int = cfg_field(800, "Env steps per learner update.", min=1)
    lr: float = cfg_field(5e-4, "Adam learning rate of the learner.", min=0, min_exclusive=True)
    grad_clip: float | None = cfg_field(40.0, "Clip the gradients' global norm to this (None: no clipping).", min=0, min_exclusive=True)
    vf_loss_coeff: float = cfg_field(0.5, "Weight of the value-function loss.", min=0)
    entropy_coeff: float = cfg_field(0.01, "Weight of the entropy bonus.", min=0)
    vtrace_clip_rho_threshold: float = cfg_field(1.0, "rho-bar: clip of the importance weights in the targets.", min=0)
    vtrace_clip_pg_rho_threshold: float = cfg_field(1.0, "Clip of the importance weights in the policy gradient.", min=0)
    vtrace_clip_c_threshold: float = cfg_field(1.0, "c-bar: clip of the trace-cutting coefficients.", min=0)
    broadcast_interval: int = cfg_field(1, "Learner updates between weight refreshes of a worker.", min=1)
    learner_queue_size: int = cfg_field(16, "Train batches the learner thread may have waiting.", min=1)
    batch_mode: str = cfg_field("truncate_episodes", "V-trace needs fixed-length fragments.", choices=("truncate_episodes",))

    def policy_config(self) -> dict[str, Any]:
        return {
            **super().policy_config(),
            "rollout_fragment_length": self.rollout_fragment_length,
            "vf_loss_coeff": self.vf_loss_coeff,
            "entropy_coeff": self.entropy_coeff,
            "clip_rho": self.vtrace_clip_rho_threshold,
            "clip_pg_rho": self.vtrace_clip_pg_rho_threshold,
            "clip_c": self.vtrace_clip_c_threshold,
        }


def _time_major(x: torch.Tensor, horizon: int) -> torch.Tensor:
    """Rows of whole fragments (one env's ``horizon`` steps after another) as ``[horizon, num_fragments, ...]``."""
    return x.reshape(-1, horizon, *x.shape[1:]).transpose(0, 1)


def impala_loss(policy: TorchPolicy, model: nn.Module, dist_class: type[ActionDistribution], batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
    """Policy gradient on V-trace advantages + value loss to the V-trace targets - entropy bonus."""
    config = policy.config
    horizon = int(config["rollout_fragment_length"])
    logits, values = model(batch[SampleBatch.OBS])
    with torch.no_grad():
        _, next_values = model(batch[SampleBatch.NEW_OBS])
    dist = dist_class(logits)
    logp = dist.logp(batch[SampleBatch.ACTIONS])
    terminated = batch[SampleBatch.TERMINATEDS].float()
    ended = torch.maximum(terminated, batch[SampleBatch.TRUNCATEDS].float())
    gamma = float(config["gamma"])

    def tm(x: torch.Tensor) -> torch.Tensor:
        return _time_major(x, horizon)

    targets = vtrace(
        log_rhos=tm(logp.detach() - batch[SampleBatch.ACTION_LOGP]),
        discounts=tm(gamma * (1.0 - terminated)),
        rewards=tm(batch[SampleBatch.REWARDS].float()),
        values=tm(values.detach()),
        next_values=tm(next_values),
        continues=tm(1.0 - ended),
        clip_rho_threshold=config["clip_rho"],
        clip_pg_rho_threshold=config["clip_pg_rho"],
        clip_c_threshold=config["clip_c"],
    )
    policy_loss = -(tm(logp) * targets.pg_advantages).mean()
    vf_loss = 0.5 * (tm(values) - targets.vs).pow(2).mean()
    entropy = dist.entropy().mean()
    loss = policy_loss + config["vf_loss_coeff"] * vf_loss - config["entropy_coeff"] * entropy
    return loss, {"policy_loss": policy_loss.item(), "vf_loss": vf_loss.item(), "entropy": entropy.item()}


def make_impala_policy(obs_space: gym.Space, action_space: gym.Space, config: ImpalaConfig) -> PolicySpec:
    """A TorchPolicy with the V-trace loss and no postprocessing (the learner corrects off-policy data)."""
    return PolicySpec(TorchPolicy, obs_space, action_space, config.policy_config(), {"loss_fn": impala_loss})


def _without_source(batch: SampleBatch) -> tuple[None, SampleBatch]:
    return None, batch


def execution_plan(workers: WorkerSet, config: ImpalaConfig) -> LocalIterator[dict[str, Any]]:
    """Async rollouts -> weights to the source -> ConcatBatches -> learner queue || learner results."""
    learner = LearnerThread(workers.local_worker(), inqueue_size=config.learner_queue_size)
    learner.start()
    workers.on_stop(learner.stop)
    enqueue_op = (
        ParallelRollouts(workers, mode="async", num_async=2)
        .zip_with_source_actor()
        .for_each(SendWeightsToSource(learner, workers, min_learner_updates=config.broadcast_interval))
        .combine(ConcatBatches(config.train_batch_size))
        .for_each(_without_source)
        .transform(Enqueue(learner.inqueue))
    )
    dequeue_op = Dequeue(learner.outqueue, check=learner.check).for_each(record_learner_results)
    merged = Concurrently([enqueue_op, dequeue_op], mode="async", output_indexes=[1])
    return StandardMetricsReporting(merged, workers, config)


ALGORITHM = Algorithm("impala", "IMPALA: async actor-learner with V-trace", ImpalaConfig, make_impala_policy, execution_plan)
