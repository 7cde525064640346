"""IMPALA: asynchronous actor-learner training with V-trace off-policy corrections (Espeholt et al. 2018).

Plan: async rollouts (weights sent back to a worker once the learner has made
``broadcast_interval`` updates since its last) -> optional MixInReplay -> ConcatBatches
-> the learner thread's queue; the learner's results drive the counters and the
iterations. With ``num_aggregation_workers`` the gathering, replay and batching run in
aggregator actors, each over a group of rollout workers (tree aggregation).
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
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
    AggregatedRollouts,
    ConcatBatches,
    Concurrently,
    Dequeue,
    Enqueue,
    MixInReplay,
    ParallelRollouts,
    StandardMetricsReporting,
)
from flowrl.operators.learner_ops import SendWeightsToSource, record_learner_results
from flowrl.policy import PolicySpec, TorchPolicy
from flowrl.policy.distributions import ActionDistribution
from flowrl.policy.vtrace import VTraceReturns, vtrace


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
    num_sgd_iter: int = cfg_field(1, "Epochs the learner makes over each train batch.", min=1)
    sgd_minibatch_size: int = cfg_field(
        0, "Env steps per learner minibatch, rounded down to whole fragments (0: the whole train batch).", min=0
    )
    replay_proportion: float = cfg_field(0.0, "Replayed fragments mixed in per fresh fragment, on average (0: no replay).", min=0)
    replay_buffer_num_slots: int = cfg_field(100, "Most recent fragments kept for MixInReplay.", min=1)
    num_aggregation_workers: int = cfg_field(
        0,
        "Aggregator actors that gather and batch for groups of rollout workers (0: the driver does it). "
        "Aggregators do not replace rollout workers: one that dies ends the run.",
        min=0,
    )
    num_cpus_per_aggregator: float = cfg_field(0.5, "CPUs Ray reserves for each aggregator actor.", min=0)
    batch_mode: str = cfg_field("truncate_episodes", "V-trace needs fixed-length fragments.", choices=("truncate_episodes",))

    def check(self) -> list[str]:
        problems = super().check()
        if self.sgd_minibatch_size > self.train_batch_size:
            problems.append(f"sgd_minibatch_size={self.sgd_minibatch_size} > train_batch_size={self.train_batch_size}")
        if self.num_aggregation_workers > self.num_workers:
            problems.append(
                f"num_aggregation_workers={self.num_aggregation_workers} > num_workers={self.num_workers}: "
                "each aggregator needs at least one rollout worker"
            )
        return problems

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


def time_major(x: torch.Tensor, horizon: int) -> torch.Tensor:
    """Rows of whole fragments (one env's ``horizon`` steps after another) as ``[horizon, num_fragments, ...]``."""
    return x.reshape(-1, horizon, *x.shape[1:]).transpose(0, 1)


def batch_vtrace(config: Mapping[str, Any], batch: dict[str, torch.Tensor], target_logp: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor) -> VTraceReturns:
    """V-trace targets (time-major) of a batch of whole fragments for a target policy's log-probabilities.

    ``target_logp``, ``values`` and ``next_values`` are per row; no gradient flows through them.
    """
    horizon = int(config["rollout_fragment_length"])
    terminated = batch[SampleBatch.TERMINATEDS].float()
    ended = torch.maximum(terminated, batch[SampleBatch.TRUNCATEDS].float())

    def tm(x: torch.Tensor) -> torch.Tensor:
        return time_major(x.detach(), horizon)

    return vtrace(
        log_rhos=tm(target_logp - batch[SampleBatch.ACTION_LOGP]),
        discounts=tm(float(config["gamma"]) * (1.0 - terminated)),
        rewards=tm(batch[SampleBatch.REWARDS].float()),
        values=tm(values),
        next_values=tm(next_values),
        continues=tm(1.0 - ended),
        clip_rho_threshold=config["clip_rho"],
        clip_pg_rho_threshold=config["clip_pg_rho"],
        clip_c_threshold=config["clip_c"],
    )


def impala_loss(policy: TorchPolicy, model: nn.Module, dist_class: type[ActionDistribution], batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
    """Policy gradient on V-trace advantages + value loss to the V-trace targets - entropy bonus."""
    config = policy.config
    horizon = int(config["rollout_fragment_length"])
    logits, values = model(batch[SampleBatch.OBS])
    with torch.no_grad():
        _, next_values = model(batch[SampleBatch.NEW_OBS])
    dist = dist_class(logits)
    logp = dist.logp(batch[SampleBatch.ACTIONS])
    targets = batch_vtrace(config, batch, logp, values, next_values)
    policy_loss = -(time_major(logp, horizon) * targets.pg_advantages).mean()
    vf_loss = 0.5 * (time_major(values, horizon) - targets.vs).pow(2).mean()
    entropy = dist.entropy().mean()
    loss = policy_loss + config["vf_loss_coeff"] * vf_loss - config["entropy_coeff"] * entropy
    return loss, {"policy_loss": policy_loss.item(), "vf_loss": vf_loss.item(), "entropy": entropy.item()}


def make_impala_policy(obs_space: gym.Space, action_space: gym.Space, config: ImpalaConfig) -> PolicySpec:
    """A TorchPolicy with the V-trace loss and no postprocessing (the learner corrects off-policy data)."""
    return PolicySpec(TorchPolicy, obs_space, action_space, config.policy_config(), {"loss_fn": impala_loss})


def _without_source(batch: SampleBatch) -> tuple[None, SampleBatch]:
    return None, batch


def start_learner(workers: WorkerSet, config: ImpalaConfig) -> LearnerThread:
    """The learner thread: minibatch epochs that keep fragments whole; stopped with the workers."""
    learner = LearnerThread(
        workers.local_worker(),
        inqueue_size=config.learner_queue_size,
        policies=workers.trainable_policies(),
        num_sgd_iter=config.num_sgd_iter,
        sgd_minibatch_size=config.sgd_minibatch_size,
        sequence_length=config.rollout_fragment_length,
    )
    learner.start()
    workers.on_stop(learner.stop)
    return learner


def train_batches(workers: WorkerSet, config: ImpalaConfig, learner: LearnerThread) -> LocalIterator[tuple[None, SampleBatch]]:
    """Train batches for ``learner``'s inqueue, fresh weights going back to where each came from.

    The gather, MixInReplay and ConcatBatches run in the driver, or inside aggregator
    actors when ``num_aggregation_workers`` > 0.
    """

    def batching(fragments: LocalIterator[SampleBatch]) -> LocalIterator[SampleBatch]:
        if config.replay_proportion > 0:
            fragments = fragments.combine(MixInReplay(config.replay_buffer_num_slots, config.replay_proportion, config.seed))
        return fragments.combine(ConcatBatches(config.train_batch_size))

    def weights_back(source_class: str) -> SendWeightsToSource:
        return SendWeightsToSource(learner, workers, min_learner_updates=config.broadcast_interval, source_class=source_class)

    if config.num_aggregation_workers:
        batches = (
            AggregatedRollouts(workers, config.num_aggregation_workers, batching, num_cpus_per_aggregator=config.num_cpus_per_aggregator)
            .zip_with_source_actor()
            .for_each(weights_back("AggregatorWorker"))
        )
    else:
        fragments = ParallelRollouts(workers, mode="async", num_async=2).zip_with_source_actor().for_each(weights_back("RolloutWorker"))
        batches = batching(fragments)
    return batches.for_each(_without_source)


def execution_plan(workers: WorkerSet, config: ImpalaConfig) -> LocalIterator[dict[str, Any]]:
    """Train batches (weights back to their sources) -> learner queue || learner results -> metrics."""
    learner = start_learner(workers, config)
    enqueue_op = train_batches(workers, config, learner).transform(Enqueue(learner.inqueue))
    dequeue_op = Dequeue(learner.outqueue, check=learner.check).for_each(record_learner_results)
    merged = Concurrently([enqueue_op, dequeue_op], mode="async", output_indexes=[1])
    return StandardMetricsReporting(merged, workers, config)


ALGORITHM = Algorithm("impala", "IMPALA: async actor-learner with V-trace", ImpalaConfig, make_impala_policy, execution_plan)
