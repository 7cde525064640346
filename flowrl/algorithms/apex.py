"""Ape-X DQN: distributed prioritized experience replay (Horgan et al. 2018).

Three sub-flows run concurrently (async union):
1. rollout workers sample (each with its own epsilon) -> store into a random replay shard ->
   send that worker fresh weights once it sampled ``max_weight_sync_delay`` steps since its last;
2. replay shards -> batches into the learner thread's queue;
3. the learner's results -> new priorities back to the shard that produced the batch ->
   target network updates by steps trained. Only this sub-flow's outputs drive iterations.

The replay shards and the learner thread are plan resources (created and owned by the Trainer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from flowrl.actors import LearnerThread, PlanResources, WorkerSet
from flowrl.actors.learner_group import learner_group
from flowrl.actors.placement import REPLAY_SHARD, BundleRequest
from flowrl.actors.resources import replay_shards
from flowrl.algorithms.ddpg import DDPGConfig, make_ddpg_policy
from flowrl.algorithms.dqn import DQNConfig, make_dqn_policy
from flowrl.algorithms.registry import Algorithm
from flowrl.config import cfg_field
from flowrl.iterators import LocalIterator
from flowrl.operators import (
    STEPS_TRAINED_COUNTER,
    Concurrently,
    LearnInThread,
    ParallelRollouts,
    Replay,
    SendWeightsToSource,
    StandardMetricsReporting,
    StoreToReplayBuffer,
    ThrottleSampling,
    UpdatePriorities,
    UpdateTargetNetwork,
)


@dataclass(kw_only=True)
class ApexConfig(DQNConfig):
    """Ape-X settings: DQN's keys plus the replay tier and weight-sync pacing.

    ``buffer_size`` and ``learning_starts`` are split over the replay shards;
    ``target_network_update_freq`` counts steps trained. The default exploration gives
    worker i of N the fixed epsilon ``0.4 ** (1 + 7 * i / (N - 1))``.
    """

    defaults = {
        "num_envs_per_worker": 4,
        "rollout_fragment_length": 25,
        "train_batch_size": 128,
        "lr": 5e-4,
        "learning_starts": 2000,
        "target_network_update_freq": 4000,
        "timesteps_per_iteration": 2000,
        "model": {"fcnet_hiddens": [128, 128], "fcnet_activation": "relu"},
        "exploration_config": {"type": "PerWorkerEpsilonGreedy"},
        "worker_side_prioritization": True,
    }
    target_update_counter: ClassVar[str] = STEPS_TRAINED_COUNTER  # the learner's steps, not the workers'
    # RLlib 1.13's Ape-X DQN (rllib/agents/dqn/apex.py over DQN's), whose optimizer keys RLlib's Ape-X
    # tuned example uses; its 32 workers and 4 replay shards size the run to a machine and are not taken.
    rllib_defaults = {
        "num_envs_per_worker": 1,
        "rollout_fragment_length": 50,
        "train_batch_size": 512,
        "grad_clip": 40.0,
        "buffer_size": 2_000_000,
        "learning_starts": 50_000,
        "target_network_update_freq": 500_000,
        "training_intensity": 1.0,
        "max_weight_sync_delay": 400,
        "model": {"fcnet_hiddens": [256, 256], "fcnet_activation": "tanh"},
    }

    num_workers: int = cfg_field(2, "Remote rollout workers, each with its own fixed epsilon.", min=1)
    num_replay_shards: int = cfg_field(1, "Replay buffer shard actors.", min=1)
    replay_shard_placement: Literal["driver_node", "spread"] = cfg_field(
        "driver_node",
        "Where the replay shards run on a cluster: 'driver_node' next to the learner, which stores to and "
        "replays from them all the time; 'spread' over the nodes, to hold a buffer larger than one machine's memory.",
    )
    num_cpus_per_replay_shard: float = cfg_field(
        0.0,
        "CPUs Ray reserves for each replay shard, in the run's placement group ('driver_node' shards on the driver's "
        "node; 'spread' ones laid out by placement_strategy). 0: none reserved, and the shards run where "
        "replay_shard_placement says regardless of free CPUs.",
        min=0,
    )
    max_weight_sync_delay: int = cfg_field(200, "Steps a worker samples between weight refreshes.", min=1)
    learner_queue_size: int = cfg_field(16, "Replayed batches the learner thread may have waiting.", min=1)
    training_intensity: float | None = cfg_field(
        4.0,
        "If set, sampling waits while it is ahead of learning_starts + steps_trained / training_intensity "
        "(steps replayed per step sampled); None: sample as fast as the workers can.",
        min=0,
        min_exclusive=True,
    )


def bundles(config: ApexConfig) -> list[BundleRequest]:
    """A bundle per replay shard when they ask for CPUs (on the driver's node unless spread)."""
    on_driver_node = config.replay_shard_placement == "driver_node"
    cpus = {"CPU": "num_cpus_per_replay_shard"}
    return [BundleRequest.from_config(REPLAY_SHARD, config, "num_replay_shards", cpus, on_driver_node=on_driver_node)]


def make_resources(workers: WorkerSet, config: ApexConfig) -> PlanResources:
    """The replay shards and a learner thread (one gradient step per replayed batch, in the
    learner group the config asks for)."""
    shards = replay_shards(
        config,
        config.num_replay_shards,
        num_cpus=config.num_cpus_per_replay_shard,
        placement=config.replay_shard_placement,
        reservation=workers.reservation,
    )
    learners = learner_group(workers, config)
    return PlanResources(
        replay_actors=shards,
        learner=LearnerThread(
            workers.local_worker(),
            inqueue_size=config.learner_queue_size,
            timeout_s=config.learner_timeout_s,
            learners=learners,
        ),
        learners=learners,
        checkpoint_replay_contents=config.store_buffer_in_checkpoints,
    )


def execution_plan(workers: WorkerSet, config: ApexConfig, resources: PlanResources) -> LocalIterator[dict[str, Any]]:
    """Store rollouts || replay into the learner || learner results -> priorities, target updates."""
    learner, shards = resources.need_learner(), resources.need_replay_actors()
    rollouts = ParallelRollouts(workers, mode="async", num_async=2, worker_priorities=config.worker_side_prioritization)
    if config.training_intensity is not None:
        rollouts = rollouts.transform(
            ThrottleSampling(config.training_intensity, config.learning_starts, replay_shards=shards)
        )
    store_op = (
        rollouts.for_each(StoreToReplayBuffer(actors=shards))
        .zip_with_source_actor()
        .for_each(SendWeightsToSource(learner, workers, min_steps=config.max_weight_sync_delay))
    )
    replay_op, learned = LearnInThread(Replay(actors=shards, num_async=4).zip_with_source_actor(), learner)
    update_op = learned.for_each(UpdatePriorities(actors=shards)).for_each(
        UpdateTargetNetwork(workers, config, resources=resources)
    )
    merged = Concurrently([store_op, replay_op, update_op], mode="async", output_indexes=[2])
    # Episode statistics from the lowest-epsilon third of the workers (the highest indices): what the policy can do.
    n = config.num_workers
    return StandardMetricsReporting(merged, workers, config, selected_workers=range(n - max(1, n // 3) + 1, n + 1))


ALGORITHM = Algorithm(
    "apex",
    "Ape-X DQN: distributed prioritized replay",
    ApexConfig,
    make_dqn_policy,
    execution_plan,
    make_resources=make_resources,
    bundles=bundles,
    live_keys=frozenset({"lr"}),
    asynchronous=True,
    learner_group=True,
)


@dataclass(kw_only=True)
class ApexDDPGConfig(ApexConfig, DDPGConfig):
    """Ape-X DDPG: DDPG's actor-critic on the Ape-X plan (Gaussian exploration noise on every worker).

    Soft target updates after every training step; the actor and critic sizes are
    ``actor_hiddens`` and ``critic_hiddens`` (``model`` is unused).
    """

    # Ape-X's keys win over DDPG's in the merge; these are DDPG's again.
    defaults = {"exploration_config": {}, "target_network_update_freq": 0, "tau": 0.005, "model": {}}
    # RLlib 1.13's Ape-X DDPG (rllib/agents/ddpg/apex.py over DDPG's). Its per-worker Ornstein-Uhlenbeck
    # exploration flowrl does not have, and its 32 workers and 4 replay shards are not taken.
    rllib_defaults = {
        "num_envs_per_worker": 1,
        "rollout_fragment_length": 50,
        "train_batch_size": 512,
        "grad_clip": None,
        "buffer_size": 2_000_000,
        "learning_starts": 50_000,
        "target_network_update_freq": 500_000,
        "tau": 0.002,
        "training_intensity": None,
        "max_weight_sync_delay": 400,
        "actor_hiddens": [400, 300],
        "critic_hiddens": [400, 300],
        "l2_reg": 1e-6,
    }


APEX_DDPG = Algorithm(
    "apex_ddpg",
    "Ape-X DDPG: DDPG on distributed prioritized replay",
    ApexDDPGConfig,
    make_ddpg_policy,
    execution_plan,
    make_resources=make_resources,
    bundles=bundles,
    asynchronous=True,
    learner_group=True,
)
