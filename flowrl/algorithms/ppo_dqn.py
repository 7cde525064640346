"""PPO and DQN trained side by side on one multi-agent rollout stream: a composed plan.

Even agent ids act with ``ppo_policy`` and odd ones with ``dqn_policy`` (by default). The
plan duplicates the rollouts; one branch keeps the DQN policy's experience and runs DQN's
replay sub-flow on it, the other keeps the PPO policy's and runs PPO's; an async union
joins them. Each sub-flow broadcasts only the weights of the policy it trained.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Hashable

import gymnasium as gym

from flowrl.actors import PlanResources, WorkerSet
from flowrl.actors.learner_group import learner_group
from flowrl.algorithms import dqn, ppo
from flowrl.algorithms.dqn import DQNConfig
from flowrl.algorithms.ppo import PPOConfig
from flowrl.algorithms.registry import Algorithm
from flowrl.config import TrainerConfig, cfg_field, field_default
from flowrl.errors import ConfigError
from flowrl.iterators import LocalIterator
from flowrl.operators import Concurrently, ParallelRollouts, SelectExperiences, StandardMetricsReporting
from flowrl.policy import PolicySpec

PPO_POLICY, DQN_POLICY = "ppo_policy", "dqn_policy"
#: The learner group's keys: one group (or the driver) trains both policies.
LEARNER_KEYS = ("num_learners", "num_cpus_per_learner", "num_gpus_per_learner")
# The keys that describe sampling and the run, not learning: the sub-algorithms take them from here.
SHARED_KEYS = (
    "num_workers",
    "num_envs_per_worker",
    "rollout_fragment_length",
    "env_config",
    "seed",
    "num_gpus",
    "clip_actions",
    "compress_observations",
    "num_cpus_per_worker",
)


# Keys of the shared config that only the sub-algorithms' configs use.
LEARNING_KEYS = (
    "lr",
    "lr_schedule",
    "entropy_coeff_schedule",
    "gamma",
    "grad_clip",
    "model",
    "explore",
    "exploration_config",
    "train_batch_size",
)


def even_ppo_odd_dqn(agent_id: Hashable) -> str:
    """The default mapping: agents with an even id (or an even position in a name ending in a digit) to PPO."""
    digits = "".join(ch for ch in str(agent_id) if ch.isdigit())
    return PPO_POLICY if not digits or int(digits) % 2 == 0 else DQN_POLICY


def _sub_config_problems(algorithm: str, config_class: type[TrainerConfig]) -> Any:
    def problems(values: dict[str, Any]) -> list[str]:
        try:
            config_class.from_dict(values)
        except ConfigError as e:
            return [f"{algorithm}: {problem}" for problem in e.problems]
        return []

    return problems


@dataclass(kw_only=True)
class PPODQNConfig(TrainerConfig):
    """Sampling keys for both (see :class:`~flowrl.config.TrainerConfig`), and each algorithm's own
    keys in ``ppo`` and ``dqn``.

    ``policies`` are the two policies (spaces from their agents); ``policy_mapping_fn``
    sends even agent ids to ``ppo_policy`` and odd ones to ``dqn_policy`` by default.
    """

    defaults = {
        "rollout_fragment_length": 50,
        "timesteps_per_iteration": 2000,
        "policies": {PPO_POLICY: None, DQN_POLICY: None},
        "policy_mapping_fn": even_ppo_odd_dqn,
    }

    ppo: dict[str, Any] = cfg_field(
        {"train_batch_size": 2000, "sgd_minibatch_size": 128, "num_sgd_iter": 10, "lr": 3e-4},
        "PPO's keys (PPOConfig) for ppo_policy; the sampling keys above apply to both.",
        validator=_sub_config_problems("ppo", PPOConfig),
    )
    dqn: dict[str, Any] = cfg_field(
        {
            "train_batch_size": 64,
            "lr": 1e-3,
            "target_network_update_freq": 500,
            "learning_starts": 1000,
            "n_step": 3,
            "training_intensity": 4,
            "model": {"fcnet_hiddens": [128, 128], "fcnet_activation": "relu"},
        },
        "DQN's keys (DQNConfig) for dqn_policy; the sampling keys above apply to both.",
        validator=_sub_config_problems("dqn", DQNConfig),
    )

    def check(self) -> list[str]:
        problems = super().check()
        if sorted(self.policies) != sorted([PPO_POLICY, DQN_POLICY]):
            problems.append(f"policies={sorted(self.policies)}: ppo_dqn trains exactly {[PPO_POLICY, DQN_POLICY]}")
        for pid, spec in self.policies.items():
            if spec and "config" in spec:
                problems.append(
                    f"policies[{pid!r}]['config']: ppo_dqn takes each policy's keys from 'ppo' and 'dqn' instead"
                )
        if self.policies_to_train is not None and sorted(self.policies_to_train) != sorted([PPO_POLICY, DQN_POLICY]):
            problems.append(f"policies_to_train={self.policies_to_train}: ppo_dqn trains both of its policies")
        # Learning keys at the top level would reach neither sub-flow: say where they go.
        for f in dataclasses.fields(TrainerConfig):
            if f.name in LEARNING_KEYS and getattr(self, f.name) != field_default(f):
                value = getattr(self, f.name)
                problems.append(
                    f"{f.name}={value!r} applies to neither policy in ppo_dqn; set ppo.{f.name} or dqn.{f.name}"
                )
        for name, sub in (("ppo", self.ppo), ("dqn", self.dqn)):
            for key in sorted(set(sub) & set(SHARED_KEYS)):
                problems.append(f"{name}[{key!r}]: a sampling key shared by both policies; set {key} at the top level")
            for key in sorted(set(sub) & set(LEARNER_KEYS)):
                problems.append(f"{name}[{key!r}]: one learner group trains both policies; set {key} at the top level")
        if self.dqn.get("worker_side_prioritization"):
            problems.append(
                "dqn['worker_side_prioritization']=True is not available for ppo_dqn: its rollouts feed both "
                "policies and store dqn_policy's rows at the max priority; set it false"
            )
        return problems

    def _shared(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in SHARED_KEYS}

    def ppo_config(self) -> PPOConfig:
        """The PPO config of ``ppo_policy``: the shared sampling keys plus ``ppo``."""
        return PPOConfig.from_dict({**self._shared(), **self.ppo})

    def dqn_config(self) -> DQNConfig:
        """The DQN config of ``dqn_policy``: the shared sampling keys plus ``dqn``."""
        return DQNConfig.from_dict({**self._shared(), **self.dqn})


def make_policies(
    spaces: dict[str, tuple[gym.Space[Any], gym.Space[Any]]], config: PPODQNConfig
) -> dict[str, PolicySpec]:
    """A PPO policy and a DQN policy, each built by its own algorithm from its own config."""
    return {
        PPO_POLICY: ppo.make_ppo_policy(*spaces[PPO_POLICY], config.ppo_config()),
        DQN_POLICY: dqn.make_dqn_policy(*spaces[DQN_POLICY], config.dqn_config()),
    }


def _needs_multi_agent(obs_space: gym.Space[Any], action_space: gym.Space[Any], config: PPODQNConfig) -> PolicySpec:
    raise ConfigError(
        ["ppo_dqn trains the policies of a multi-agent env (e.g. MultiAgentCartPole), not a single-agent one"]
    )


def make_resources(workers: WorkerSet, config: PPODQNConfig) -> PlanResources:
    """DQN's replay buffer, for dqn_policy's experience, and the learner group the config asks for (both policies)."""
    return dataclasses.replace(
        dqn.make_resources(workers, config.dqn_config()), learners=learner_group(workers, config)
    )


def execution_plan(workers: WorkerSet, config: PPODQNConfig, resources: PlanResources) -> LocalIterator[dict[str, Any]]:
    """Rollouts -> duplicate: DQN's sub-flow on dqn_policy's experience || PPO's on ppo_policy's -> metrics."""
    ppo_rollouts, dqn_rollouts = ParallelRollouts(workers, mode="bulk_sync").duplicate(2)
    dqn_experience = dqn_rollouts.for_each(SelectExperiences([DQN_POLICY]))
    dqn_op = dqn.training_flow(dqn_experience, workers, config.dqn_config(), resources, [DQN_POLICY])
    ppo_experience = ppo_rollouts.for_each(SelectExperiences([PPO_POLICY]))
    ppo_op = ppo.training_flow(ppo_experience, workers, config.ppo_config(), resources, [PPO_POLICY])
    return StandardMetricsReporting(Concurrently([ppo_op, dqn_op], mode="async"), workers, config)


ALGORITHM = Algorithm(
    "ppo_dqn",
    "PPO and DQN policies trained side by side on one multi-agent rollout stream",
    PPODQNConfig,
    _needs_multi_agent,
    execution_plan,
    multi_agent=True,
    make_policies=make_policies,
    make_resources=make_resources,
    learner_group=True,
)
