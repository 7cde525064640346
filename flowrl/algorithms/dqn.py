"""Deep Q-networks: double Q-learning, dueling heads, n-step returns, prioritized replay.

Plan (the RLlib Flow DQN shape): two sub-flows run in round robin. One samples and stores
into the replay buffer; the other replays, trains, updates priorities and the target
network. Their round-robin weights set ``training_intensity`` (steps replayed per step sampled).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import gymnasium as gym

from flowrl.actors import PlanResources, WorkerSet
from flowrl.actors.learner_group import learner_group
from flowrl.actors.offline_input import mixed_input
from flowrl.actors.resources import local_replay_buffer
from flowrl.algorithms.registry import Algorithm
from flowrl.config import TrainerConfig, cfg_field
from flowrl.data import SampleBatch
from flowrl.deferred import DeferredModule, nn, torch
from flowrl.iterators import LocalIterator
from flowrl.operators import (
    STEPS_SAMPLED_COUNTER,
    Concurrently,
    MixInput,
    ParallelRollouts,
    Replay,
    StandardMetricsReporting,
    StoreToReplayBuffer,
    TrainOneStep,
    UpdatePriorities,
    UpdateTargetNetwork,
)
from flowrl.policy import LossOutput, PolicySpec, TorchPolicy, nstep_postprocess
from flowrl.policy.action_masks import masked_bootstrap_q
from flowrl.policy.custom_model import Q_VALUES
from flowrl.policy.distributions import DistFactory
from flowrl.policy.postprocessing import DISCOUNTS

if TYPE_CHECKING:
    from flowrl.policy import networks
else:
    networks = DeferredModule("flowrl.policy.networks")  # torch modules: imported when a policy is built


@dataclass(kw_only=True)
class DQNConfig(TrainerConfig):
    """DQN settings (shared keys: see :class:`~flowrl.config.TrainerConfig`)."""

    #: What ``target_network_update_freq`` counts, for ``UpdateTargetNetwork``.
    target_update_counter: ClassVar[str] = STEPS_SAMPLED_COUNTER

    defaults = {
        "num_workers": 0,
        "rollout_fragment_length": 4,
        "train_batch_size": 64,
        "lr": 1e-3,
        "grad_clip": 10.0,
        "timesteps_per_iteration": 1000,
        "exploration_config": {
            "type": "EpsilonGreedy",
            "initial_epsilon": 1.0,
            "final_epsilon": 0.02,
            "epsilon_timesteps": 10_000,
        },
    }
    # RLlib 1.13's DQN (rllib/agents/dqn/dqn.py over simple_q.py; 2.0-2.1 the same, 2.2 made
    # rollout_fragment_length 'auto'). Its Q head's hidden layer (hiddens: [256]) flowrl does not have.
    rllib_defaults = {
        "lr": 5e-4,
        "train_batch_size": 32,
        "grad_clip": 40.0,
        "n_step": 1,
        "model": {"fcnet_hiddens": [256, 256]},
    }

    buffer_size: int = cfg_field(50_000, "Replay buffer capacity in transitions.", min=1)
    learning_starts: int = cfg_field(1000, "Env steps sampled before training starts.", min=0)
    target_network_update_freq: int = cfg_field(
        500, "Env steps sampled between target network updates (0: after every training step).", min=0
    )
    tau: float = cfg_field(
        1.0, "Target update rate: 1 copies the network, smaller values blend it in.", min=0, max=1, min_exclusive=True
    )
    n_step: int = cfg_field(3, "Steps of reward summed into each transition's return.", min=1, per_policy=True)
    double_q: bool = cfg_field(
        True, "Pick next actions with the online network, value them with the target network.", per_policy=True
    )
    dueling: bool = cfg_field(True, "Separate state-value and advantage streams in the Q head.", per_policy=True)
    prioritized_replay: bool = cfg_field(True, "Sample transitions in proportion to their TD error.")
    prioritized_replay_alpha: float = cfg_field(0.6, "How strongly priorities skew sampling (0: uniform).", min=0)
    prioritized_replay_beta: float = cfg_field(0.4, "Importance-sampling correction exponent.", min=0, max=1)
    prioritized_replay_eps: float = cfg_field(1e-6, "Added to |TD error| to get a priority.", min=0, min_exclusive=True)
    worker_side_prioritization: bool = cfg_field(
        False,
        "The rollout workers compute the n-step TD error of each row they sample, with their weights and the "
        "learner's target network (sent with the weights), and replay stores the row at |TD error| + "
        "prioritized_replay_eps instead of the max priority (Ape-X). Needs prioritized_replay; with "
        "num_workers=0 the local worker computes them with the learner's own networks.",
    )
    store_buffer_in_checkpoints: bool = cfg_field(
        True,
        "Save the replay buffer's contents in checkpoints, not only its counters: a resumed run "
        "goes on with the same experience (and a seeded one exactly). Turn off for buffers too large to save.",
    )
    training_intensity: float | None = cfg_field(
        None,
        "Transitions replayed per transition sampled; None keeps the natural ratio "
        "(one replayed minibatch per sampled fragment).",
        min=0,
        min_exclusive=True,
    )

    def check(self) -> list[str]:
        problems = super().check()
        if self.worker_side_prioritization and not self.prioritized_replay:
            problems.append(
                "worker_side_prioritization=True needs prioritized_replay=True: the workers' TD errors are "
                "priorities, which only a prioritized replay buffer keeps; turn prioritized_replay on or "
                "worker_side_prioritization off"
            )
        return problems

    def sampled_per_round(self) -> int:
        """Env steps one ParallelRollouts item holds."""
        return self.rollout_fragment_length * self.num_envs_per_worker * max(1, self.num_workers)


def q_and_target(
    policy: TorchPolicy[DQNConfig], model: nn.Module, batch: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's Q-value of its action (with gradient) and its n-step target (without): the reward plus
    the discounted (double) target Q-value over the next state's legal actions, unless it terminated."""
    q_values, _ = model(batch[SampleBatch.OBS])
    actions = batch[SampleBatch.ACTIONS].long()
    q_taken = q_values.gather(1, actions.unsqueeze(1)).squeeze(1)
    assert policy.target_model is not None
    with torch.no_grad():
        next_target, _ = policy.target_model(batch[SampleBatch.NEW_OBS])
        next_online = model(batch[SampleBatch.NEW_OBS])[0] if policy.config.double_q else None
        # The best legal action of the next state (its action mask, when the env gives them).
        next_q = masked_bootstrap_q(next_target, next_online, batch.get(SampleBatch.NEXT_ACTION_MASK))
        # Bootstrap unless the episode terminated (a truncated one goes on).
        not_done = 1.0 - batch[SampleBatch.TERMINATEDS].float()
        target = batch[SampleBatch.REWARDS] + batch[DISCOUNTS] * not_done * next_q
    return q_taken, target


def dqn_td_error(policy: TorchPolicy[DQNConfig], batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each row's n-step TD error with the policy's model and target network, as the loss computes it
    (worker-side priorities)."""
    q_taken, target = q_and_target(policy, policy.model, batch)
    return q_taken - target


def dqn_loss(
    policy: TorchPolicy[DQNConfig],
    model: nn.Module,
    dist_class: DistFactory,
    batch: dict[str, torch.Tensor],
) -> LossOutput:
    """Importance-weighted Huber loss on the n-step TD error (:func:`q_and_target`); the TD errors set priorities."""
    q_taken, target = q_and_target(policy, model, batch)
    td_error = q_taken - target
    weights = batch.get(SampleBatch.WEIGHTS, torch.ones_like(td_error))
    loss = (weights * nn.functional.smooth_l1_loss(q_taken, target, reduction="none")).mean()
    mean_loss, mean_q = torch.stack([loss, q_taken.mean()]).detach().tolist()  # one conversion, not an .item() each
    return LossOutput(loss, {"loss": mean_loss, "mean_q": mean_q}, td_error)


def make_dqn_policy(obs_space: gym.Space[Any], action_space: gym.Space[Any], config: DQNConfig) -> PolicySpec:
    """A TorchPolicy with a Q model, a target network, the DQN loss and n-step postprocessing."""
    kwargs = {
        "loss_fn": dqn_loss,
        "postprocess_fn": nstep_postprocess,
        "make_model": _dueling_q_model if config.dueling else _q_model,
        "model_interface": Q_VALUES,
        "target_network": True,
        "td_error_fn": dqn_td_error,
    }
    return PolicySpec(TorchPolicy, obs_space, action_space, config, kwargs)


def _q_model(
    obs_space: gym.Space[Any], action_space: gym.Space[Any], num_outputs: int, model_config: Mapping[str, Any]
) -> nn.Module:
    return networks.QModel(obs_space, num_outputs, model_config, dueling=False)


def _dueling_q_model(
    obs_space: gym.Space[Any], action_space: gym.Space[Any], num_outputs: int, model_config: Mapping[str, Any]
) -> nn.Module:
    return networks.QModel(obs_space, num_outputs, model_config, dueling=True)


def round_robin_weights(config: DQNConfig) -> list[int]:
    """Weights [store, replay] so replayed/sampled steps match ``training_intensity``."""
    if config.training_intensity is None:
        return [1, 1]
    natural = config.train_batch_size / config.sampled_per_round()
    ratio = config.training_intensity / natural
    return [1, max(1, round(ratio))] if ratio >= 1 else [max(1, round(1 / ratio)), 1]


def make_resources(workers: WorkerSet, config: DQNConfig) -> PlanResources:
    """A local replay buffer with the config's replay settings, the learner group the config asks for, and
    the recorded experiences ``input`` mixes with the sampler's, if any."""
    return PlanResources(
        replay_buffer=local_replay_buffer(config),
        learners=learner_group(workers, config),
        checkpoint_replay_contents=config.store_buffer_in_checkpoints,
        offline=mixed_input(workers.policy_specs, config),
    )


def training_flow(
    rollouts: LocalIterator[Any],
    workers: WorkerSet,
    config: DQNConfig,
    resources: PlanResources,
    policies: Sequence[str] | None = None,
) -> LocalIterator[Any]:
    """DQN's learning from a stream of rollouts through the replay buffer of ``resources``: store
    them || (Replay -> TrainOneStep -> UpdatePriorities -> UpdateTargetNetwork), round robin; only
    ``policies`` (default all trainable) train, in the learner group of ``resources`` if they hold
    one. A building block of composed plans (``ppo_dqn``)."""
    buffer = resources.need_replay_buffer()
    store_op = rollouts.for_each(StoreToReplayBuffer(local_buffer=buffer))
    replay_op = (
        Replay(local_buffer=buffer)
        .for_each(TrainOneStep(workers, policies, resources=resources))
        .for_each(UpdatePriorities(local_buffer=buffer))
        .for_each(UpdateTargetNetwork(workers, config, policies=policies, resources=resources))
    )
    return Concurrently(
        [store_op, replay_op], mode="round_robin", output_indexes=[1], round_robin_weights=round_robin_weights(config)
    )


def execution_plan(workers: WorkerSet, config: DQNConfig, resources: PlanResources) -> LocalIterator[dict[str, Any]]:
    """Store rollouts (mixed with recorded rows when ``input`` says so) || (Replay -> TrainOneStep ->
    UpdatePriorities -> UpdateTargetNetwork), round robin.

    DDPG and TD3 run this same plan with their own policy (soft target updates via ``tau``).
    """
    rollouts = ParallelRollouts(workers, mode="bulk_sync", worker_priorities=config.worker_side_prioritization)
    rollouts = MixInput(rollouts, resources.offline, workers, config)  # recorded rows too, if input mixes them in
    learning = training_flow(rollouts, workers, config, resources)
    return StandardMetricsReporting(learning, workers, config)


ALGORITHM = Algorithm(
    "dqn",
    "deep Q-network (double, dueling, n-step, prioritized replay)",
    DQNConfig,
    make_dqn_policy,
    execution_plan,
    multi_agent=True,
    make_resources=make_resources,
    live_keys=frozenset({"lr"}),
    learner_group=True,
    mixed_input=True,
)
