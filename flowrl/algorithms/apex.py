"""Ape-X DQN: distributed prioritized experience replay (Horgan et al. 2018).

Three sub-flows run concurrently (async union):
1. rollout workers sample (each with its own epsilon) -> store into a random replay shard ->
   send that worker fresh weights once it sampled ``max_weight_sync_delay`` steps since its last;
2. replay shards -> batches into the learner thread's queue;
3. the learner's results -> new priorities back to the shard that produced the batch ->
   target network updates by steps trained. Only this sub-flow's outputs drive iterations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import ray

from flowrl.actors import LearnerThread, RolloutWorker, WorkerSet, create_replay_actors
from flowrl.actors.learner_thread import learn_on_local_worker
from flowrl.algorithms.ddpg import DDPGConfig, make_ddpg_policy
from flowrl.algorithms.dqn import DQNConfig, make_dqn_policy, replay_buffer_args
from flowrl.algorithms.registry import Algorithm
from flowrl.config import cfg_field
from flowrl.data import (
    MultiAgentBatch,
    SampleBatch,
    as_policy_batches,
)
from flowrl.iterators import LocalIterator
from flowrl.operators import (
    Concurrently,
    Dequeue,
    Enqueue,
    ParallelRollouts,
    StandardMetricsReporting,
    UpdateTargetNetwork,
)
from flowrl.operators.learner_ops import SendWeightsToSource, record_learner_results
from flowrl.operators.replay_ops import (
    TD_ERROR,
    Replay,
    StoreToReplayBuffer,
    ThrottleSampling,
)

BATCH_INDEXES = "batch_indexes"


@dataclass(kw_only=True)
class ApexConfig(DQNConfig):
    """Ape-X settings: DQN's keys plus the replay tier and weight-sync pacing."""

    num_workers: int = cfg_field(2, "Remote rollout workers, each with its own fixed epsilon.", min=1)
    num_envs_per_worker: int = cfg_field(4, "Vectorized envs per rollout worker.", min=1)
    rollout_fragment_length: int = cfg_field(25, "Env steps per env per sample call.", min=1)
    train_batch_size: int = cfg_field(128, "Transitions per replayed SGD minibatch.", min=1)
    lr: float = cfg_field(5e-4, "Adam learning rate of the learner.", min=0, min_exclusive=True)
    buffer_size: int = cfg_field(50_000, "Replay capacity in transitions, split over the shards.", min=1)
    learning_starts: int = cfg_field(2000, "Env steps stored before replay starts (split over the shards).", min=0)
    target_network_update_freq: int = cfg_field(4000, "Steps trained between target network copies.", min=1)
    num_replay_shards: int = cfg_field(1, "Replay buffer shard actors.", min=1)
    max_weight_sync_delay: int = cfg_field(200, "Steps a worker samples between weight refreshes.", min=1)
    learner_queue_size: int = cfg_field(16, "Replayed batches the learner thread may have waiting.", min=1)
    timesteps_per_iteration: int = cfg_field(2000, "Minimum env steps sampled per train() call.", min=0)
    model: dict[str, Any] = cfg_field(
        {"fcnet_hiddens": [128, 128], "fcnet_activation": "relu"}, "Q network options (see flowrl.policy.models)."
    )
    exploration_config: dict[str, Any] = cfg_field(
        {"type": "PerWorkerEpsilonGreedy"}, "Per-worker fixed epsilons 0.4 ** (1 + 7 * i / (N - 1))."
    )
    training_intensity: float | None = cfg_field(
        4.0,
        "If set, sampling waits while it is ahead of learning_starts + steps_trained / training_intensity "
        "(steps replayed per step sampled); None: sample as fast as the workers can.",
        min=0,
        min_exclusive=True,
    )

    def policy_config(self) -> dict[str, Any]:
        return {**super().policy_config(), "num_workers": self.num_workers}


def learn_with_indexes(worker: RolloutWorker, batch: SampleBatch | MultiAgentBatch) -> tuple[dict[str, Any], int]:
    """The learner's step, keeping each policy batch's replay indexes beside its TD errors."""
    info, count = learn_on_local_worker(worker, batch)
    parts = as_policy_batches(batch)
    for pid, stats in info.items():
        stats[BATCH_INDEXES] = parts[pid][BATCH_INDEXES]
    return info, count


class UpdateReplayPriorities:
    """Send new priorities back to the replay shard each learned batch came from (pass-through)."""

    def plan_links(self) -> list[tuple[str, str]]:
        """What this operator does to actors, for the plan graph."""
        return [("ReplayActor", "update priorities")]

    def __call__(self, item: tuple[Any, dict[str, dict[str, Any]], int]) -> tuple[Any, dict[str, dict[str, Any]], int]:
        replay_actor, info, _ = item
        priorities = {}
        for pid, stats in info.items():
            td_error, indexes = stats.pop(TD_ERROR, None), stats.pop(BATCH_INDEXES, None)
            if td_error is not None and indexes is not None:
                priorities[pid] = (indexes, np.asarray(td_error))
        if priorities:
            replay_actor.update_priorities.remote(priorities)
        return item


def execution_plan(workers: WorkerSet, config: ApexConfig) -> LocalIterator[dict[str, Any]]:
    """Store rollouts || replay into the learner || learner results -> priorities, target updates."""
    replay_actors = create_replay_actors(config.num_replay_shards, buffer_size=config.buffer_size, **replay_buffer_args(config))
    learner = LearnerThread(workers.local_worker(), inqueue_size=config.learner_queue_size, learn_fn=learn_with_indexes)
    learner.start()

    def release() -> None:
        learner.stop()
        for actor in replay_actors:
            ray.kill(actor)

    workers.on_stop(release)

    rollouts = ParallelRollouts(workers, mode="async", num_async=2)
    if config.training_intensity is not None:
        rollouts = rollouts.transform(ThrottleSampling(config.training_intensity, config.learning_starts))
    store_op = (
        rollouts.for_each(StoreToReplayBuffer(actors=replay_actors, checkpoint_contents=config.store_buffer_in_checkpoints))
        .zip_with_source_actor()
        .for_each(SendWeightsToSource(learner, workers, min_steps=config.max_weight_sync_delay))
    )
    replay_op = Replay(actors=replay_actors, num_async=4).zip_with_source_actor().transform(Enqueue(learner.inqueue))
    update_op = (
        Dequeue(learner.outqueue, check=learner.check)
        .for_each(UpdateReplayPriorities())
        .for_each(record_learner_results)
        .for_each(
            UpdateTargetNetwork(
                workers, config.target_network_update_freq, by_steps_trained=True, tau=config.tau, lock=learner.lock
            )
        )
    )
    merged = Concurrently([store_op, replay_op, update_op], mode="async", output_indexes=[2])
    # Episode statistics from the lowest-epsilon third of the workers: what the policy can do.
    remote = workers.remote_workers()
    return StandardMetricsReporting(merged, workers, config, selected_workers=remote[-max(1, len(remote) // 3):])


ALGORITHM = Algorithm("apex", "Ape-X DQN: distributed prioritized replay", ApexConfig, make_dqn_policy, execution_plan)


@dataclass(kw_only=True)
class ApexDDPGConfig(ApexConfig, DDPGConfig):
    """Ape-X DDPG: DDPG's actor-critic on the Ape-X plan (Gaussian exploration noise on every worker)."""

    exploration_config: dict[str, Any] = cfg_field({}, "Set from exploration_noise and learning_starts; leave empty.")
    target_network_update_freq: int = cfg_field(0, "Steps trained between soft target updates (0: every step).", min=0)
    tau: float = cfg_field(0.005, "Soft target update rate after each training step.", min=0, max=1, min_exclusive=True)
    model: dict[str, Any] = cfg_field({}, "Unused: the actor and critic sizes are actor_hiddens and critic_hiddens.")


APEX_DDPG = Algorithm(
    "apex_ddpg", "Ape-X DDPG: DDPG on distributed prioritized replay", ApexDDPGConfig, make_ddpg_policy, execution_plan
)
