"""IMPALA: asynchronous actor-learner training with V-trace off-policy corrections (Espeholt et al. 2018).

Plan: async rollouts (weights sent back to a worker once the learner has made
``broadcast_interval`` updates since its last) -> optional MixInReplay -> ConcatBatches
-> the learner thread's queue; the learner's results drive the counters and the
iterations. With ``num_aggregation_workers`` the gathering, replay and batching run in
aggregator actors, each over a group of rollout workers (tree aggregation). The learner
thread and the aggregators are plan resources (created and owned by the Trainer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import gymnasium as gym

from flowrl.actors import AggregatorSet, LearnerThread, PlanResources, WorkerSet
from flowrl.actors.learner_group import learner_group
from flowrl.actors.placement import AGGREGATOR, BundleRequest
from flowrl.algorithms.registry import Algorithm
from flowrl.config import TrainerConfig, cfg_field
from flowrl.data import MultiAgentBatch, SampleBatch
from flowrl.deferred import nn, torch
from flowrl.iterators import LocalIterator
from flowrl.operators import (
    AggregatedRollouts,
    ConcatBatches,
    Concurrently,
    LearnerFlows,
    LearnInThread,
    MixInReplay,
    ParallelRollouts,
    SendWeightsToSource,
    StandardMetricsReporting,
)
from flowrl.policy import LossOutput, PolicySpec, TorchPolicy
from flowrl.policy.distributions import DistFactory
from flowrl.policy.vtrace import batch_vtrace, fragment_outputs, time_major

Batch = SampleBatch | MultiAgentBatch


@dataclass(kw_only=True)
class ImpalaConfig(TrainerConfig):
    """IMPALA settings (shared keys: see :class:`~flowrl.config.TrainerConfig`).

    ``rollout_fragment_length`` is the V-trace horizon; ``train_batch_size`` env steps make
    one learner update. A recurrent model (``model.use_lstm``) learns each fragment's sequences
    from their recorded initial states.
    """

    learns_from_sequences = True

    defaults = {
        "num_envs_per_worker": 8,
        "rollout_fragment_length": 50,
        "train_batch_size": 800,
        "lr": 5e-4,
        "grad_clip": 40.0,
    }
    # RLlib 1.13's IMPALA (rllib/agents/impala/impala.py; 2.0-2.2 the same).
    rllib_defaults = {
        "num_envs_per_worker": 1,
        "train_batch_size": 500,
        "model": {"fcnet_hiddens": [256, 256], "vf_share_layers": True},
    }

    num_workers: int = cfg_field(2, "Remote rollout workers (at least 1).", min=1)
    vf_loss_coeff: float = cfg_field(0.5, "Weight of the value-function loss.", min=0, per_policy=True)
    entropy_coeff: float = cfg_field(0.01, "Weight of the entropy bonus.", min=0, per_policy=True)
    vtrace_clip_rho_threshold: float = cfg_field(
        1.0, "rho-bar: clip of the importance weights in the targets.", min=0, per_policy=True
    )
    vtrace_clip_pg_rho_threshold: float = cfg_field(
        1.0, "Clip of the importance weights in the policy gradient.", min=0, per_policy=True
    )
    vtrace_clip_c_threshold: float = cfg_field(
        1.0, "c-bar: clip of the trace-cutting coefficients.", min=0, per_policy=True
    )
    broadcast_interval: int = cfg_field(1, "Learner updates between weight refreshes of a worker.", min=1)
    learner_queue_size: int = cfg_field(16, "Train batches the learner thread may have waiting.", min=1)
    num_sgd_iter: int = cfg_field(1, "Epochs the learner makes over each train batch.", min=1)
    sgd_minibatch_size: int = cfg_field(
        0, "Env steps per learner minibatch, rounded down to whole fragments (0: the whole train batch).", min=0
    )
    replay_proportion: float = cfg_field(
        0.0, "Replayed fragments mixed in per fresh fragment, on average (0: no replay).", min=0
    )
    replay_buffer_num_slots: int = cfg_field(100, "Most recent fragments kept for MixInReplay.", min=1)
    num_aggregation_workers: int = cfg_field(
        0,
        "Aggregator actors that gather and batch for groups of rollout workers (0: the driver does it). "
        "A rollout worker that fails is restarted and its aggregator recreated over the group.",
        min=0,
    )
    num_cpus_per_aggregator: float = cfg_field(0.5, "CPUs Ray reserves for each aggregator actor.", min=0)
    batch_mode: Literal["truncate_episodes"] = cfg_field("truncate_episodes", "V-trace needs fixed-length fragments.")

    def check(self) -> list[str]:
        problems = super().check()
        if self.sgd_minibatch_size > self.train_batch_size:
            problems.append(f"sgd_minibatch_size={self.sgd_minibatch_size} > train_batch_size={self.train_batch_size}")
        if self.num_aggregation_workers > self.num_workers:
            problems.append(
                f"num_aggregation_workers={self.num_aggregation_workers} > num_workers={self.num_workers}: "
                "each aggregator needs at least one rollout worker"
            )
        minibatch = self.sgd_minibatch_size or self.train_batch_size
        if self.num_learners >= 2 and minibatch // self.rollout_fragment_length < self.num_learners:
            problems.append(
                f"num_learners={self.num_learners} learners share each minibatch of {minibatch} steps "
                f"in whole fragments of rollout_fragment_length={self.rollout_fragment_length}: "
                f"it has {minibatch // self.rollout_fragment_length}; "
                "raise the batch or lower num_learners"
            )
        return problems


def impala_loss(
    policy: TorchPolicy[ImpalaConfig],
    model: nn.Module,
    dist_class: DistFactory,
    batch: dict[str, torch.Tensor],
) -> LossOutput:
    """Policy gradient on V-trace advantages + value loss to the V-trace targets - entropy bonus."""
    config = policy.config
    horizon = config.rollout_fragment_length
    # A recurrent policy's fragments come in sequences: outputs from each one's initial state.
    logits, values, next_values = fragment_outputs(policy, model, batch, horizon)
    dist = dist_class(logits)
    logp = dist.logp(batch[SampleBatch.ACTIONS])
    targets = batch_vtrace(config, batch, logp, values, next_values)
    policy_loss = -(time_major(logp, horizon) * targets.pg_advantages).mean()
    vf_loss = 0.5 * (time_major(values, horizon) - targets.vs).pow(2).mean()
    entropy = dist.entropy().mean()
    entropy_coeff = policy.scheduled("entropy_coeff")
    loss = policy_loss + config.vf_loss_coeff * vf_loss - entropy_coeff * entropy
    stats = {"policy_loss": policy_loss.item(), "vf_loss": vf_loss.item(), "entropy": entropy.item()}
    return LossOutput(loss, {**stats, "entropy_coeff": entropy_coeff})


def make_impala_policy(obs_space: gym.Space[Any], action_space: gym.Space[Any], config: ImpalaConfig) -> PolicySpec:
    """A TorchPolicy with the V-trace loss and no postprocessing (the learner corrects off-policy data)."""
    return PolicySpec(TorchPolicy, obs_space, action_space, config, {"loss_fn": impala_loss})


class TrainBatching:
    """Fragments -> optional MixInReplay -> ConcatBatches to ``train_batch_size``; runs in the
    driver or, shipped to them, in aggregator actors (picklable, unlike a closure)."""

    def __init__(self, config: ImpalaConfig) -> None:
        self.config = config

    def __call__(self, fragments: LocalIterator[Batch]) -> LocalIterator[Batch]:
        config = self.config
        if config.replay_proportion > 0:
            fragments = fragments.combine(
                MixInReplay(config.replay_buffer_num_slots, config.replay_proportion, config.seed)
            )
        return fragments.combine(ConcatBatches(config.train_batch_size))


def bundles(config: ImpalaConfig) -> list[BundleRequest]:
    """A bundle per aggregator actor (none without tree aggregation)."""
    return [
        BundleRequest.from_config(AGGREGATOR, config, "num_aggregation_workers", {"CPU": "num_cpus_per_aggregator"})
    ]


def make_resources(workers: WorkerSet, config: ImpalaConfig) -> PlanResources:
    """A learner thread (minibatch epochs that keep fragments whole, in the learner group the
    config asks for) and, with ``num_aggregation_workers``, the aggregator actors over the rollout workers."""
    learners = learner_group(workers, config)
    learner = LearnerThread(
        workers.local_worker(),
        inqueue_size=config.learner_queue_size,
        policies=workers.trainable_policies(),
        num_sgd_iter=config.num_sgd_iter,
        sgd_minibatch_size=config.sgd_minibatch_size,
        sequence_length=config.rollout_fragment_length,
        timeout_s=config.learner_timeout_s,
        learners=learners,
    )
    aggregators = None
    if config.num_aggregation_workers:
        aggregators = AggregatorSet(
            workers, config.num_aggregation_workers, TrainBatching(config), config.num_cpus_per_aggregator
        )
    return PlanResources(learner=learner, aggregators=aggregators, learners=learners)


def learning_flows(workers: WorkerSet, config: ImpalaConfig, resources: PlanResources) -> LearnerFlows:
    """Train batches (fresh weights back to where each came from) -> the learner thread: the
    enqueue sub-flow and the learner's results. IMPALA's plan, and APPO's with more steps after it."""
    learner, aggregators = resources.need_learner(), resources.aggregators
    if aggregators is not None:  # the aggregators batch; the driver gets train batches
        sources, source_class = AggregatedRollouts(workers, aggregators), "AggregatorWorker"
    else:
        sources, source_class = ParallelRollouts(workers, mode="async", num_async=2), "RolloutWorker"
    weights_back = SendWeightsToSource(
        learner, workers, min_learner_updates=config.broadcast_interval, source_class=source_class
    )
    fed_back = sources.zip_with_source_actor().for_each(weights_back)
    return LearnInThread(fed_back if aggregators is not None else TrainBatching(config)(fed_back), learner)


def execution_plan(workers: WorkerSet, config: ImpalaConfig, resources: PlanResources) -> LocalIterator[dict[str, Any]]:
    """Train batches (weights back to their sources) -> learner queue || learner results -> metrics."""
    enqueue_op, learned = learning_flows(workers, config, resources)
    merged = Concurrently([enqueue_op, learned], mode="async", output_indexes=[1])
    return StandardMetricsReporting(merged, workers, config)


ALGORITHM = Algorithm(
    "impala",
    "IMPALA: async actor-learner with V-trace",
    ImpalaConfig,
    make_impala_policy,
    execution_plan,
    make_resources=make_resources,
    bundles=bundles,
    live_keys=frozenset({"lr", "entropy_coeff", "vf_loss_coeff"}),
    asynchronous=True,
    learner_group=True,
)
