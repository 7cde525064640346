"""Multi-agent training: policies and their mapping, counters, per-policy weight sync, errors, PPO+DQN composition."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from flowrl import Trainer
from flowrl.errors import ConfigError
from flowrl.operators import AGENT_STEPS_SAMPLED_COUNTER, STEPS_SAMPLED_COUNTER

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_session")]

SMALL = {
    "num_workers": 2,
    "num_cpus_per_worker": 0.1,
    "num_envs_per_worker": 2,
    "rollout_fragment_length": 20,
    "seed": 0,
}


def by_parity(agent: int) -> str:
    return "even" if agent % 2 == 0 else "odd"


def test_ppo_with_two_policies_trains_only_those_to_train_and_syncs_only_their_weights() -> None:
    config = {
        **SMALL,
        "train_batch_size": 80,
        "sgd_minibatch_size": 40,
        "num_sgd_iter": 2,
        "policies": {"even": None, "odd": {"config": {"lr": 0.01}}},
        "policy_mapping_fn": by_parity,
        "policies_to_train": ["even"],
    }
    trainer = Trainer("ppo", "MultiAgentCartPole", config)
    try:
        local = trainer.workers.local_worker()
        assert local.get_policy("odd").config.lr == 0.01 and local.get_policy("even").config.lr == 3e-4
        before = {pid: local.get_policy(pid).get_weights() for pid in ("even", "odd")}
        result = trainer.train()
        counters = result["info"]
        # 4 agents per env step while they live: agent steps exceed env steps.
        assert counters[AGENT_STEPS_SAMPLED_COUNTER] > counters[STEPS_SAMPLED_COUNTER] >= 80
        assert set(result["info"]["learner"]) == {"even"}
        while "policy_reward_mean" not in result:  # until the first episodes end
            result = trainer.train()
        assert set(result["policy_reward_mean"]) == {"even", "odd"}
        remote = trainer.workers.foreach_worker(
            lambda w: {pid: w.get_policy(pid).get_weights() for pid in ("even", "odd")}, local=False
        )
        for weights in [{pid: local.get_policy(pid).get_weights() for pid in ("even", "odd")}, *remote]:
            assert any(not np.array_equal(weights["even"][k], before["even"][k]) for k in before["even"])
            assert all(np.array_equal(weights["odd"][k], before["odd"][k]) for k in before["odd"])
        evaluation = trainer.evaluate(num_episodes=2, seed=0)
        assert set(evaluation["policy_reward_mean"]) == {"even", "odd"} and evaluation["episodes"] == 2
    finally:
        trainer.stop()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"policies": {"a": None, "b": None}, "policy_mapping_fn": lambda agent: "c"},
            "policy_mapping_fn(0) returned 'c'",
        ),
        ({"policies": {"a": None, "b": None}}, "needs a policy_mapping_fn"),
        ({"policies": {"a": None, "b": None}, "policy_mapping_fn": lambda agent: "a"}, "no agent maps to policy 'b'"),
        ({"policies_to_train": ["nope"]}, "policies_to_train names 'nope'"),
        ({"policies": {"a": {"observation_spaces": 1}}}, "unknown key 'observation_spaces'"),
        ({"policy_mapping_fn": "no.such.module:fn"}, "cannot import 'no.such.module:fn'"),
        (
            {"policies": {"a": {"config": {"num_workers": 1}}}, "policy_mapping_fn": lambda agent: "a"},
            "policies['a']['config'] sets 'num_workers', which is not a policy key",
        ),
    ],
)
def test_bad_multi_agent_configs_raise_before_any_actor_starts(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        Trainer("ppo", "MultiAgentCartPole", {**SMALL, **config})


def test_agents_whose_spaces_differ_cannot_share_a_policy() -> None:
    from gymnasium import spaces

    from flowrl.envs import CooperativeMatching, register_env

    class MixedSpaces(CooperativeMatching):
        def observation_space(self, agent: str) -> spaces.Space:
            if agent == "agent_1":
                return spaces.Box(0.0, 1.0, (7,), np.float32)
            return super().observation_space(agent)

    register_env("MixedSpaces", MixedSpaces)
    with pytest.raises(
        ConfigError,
        match=r"the observation space of agent 'agent_1', Box.*\(7,\).*, "
        r"does not match that of policy 'default_policy'",
    ):
        Trainer("ppo", "MixedSpaces", {**SMALL, "check_env": False})


def test_policies_on_a_single_agent_env_are_rejected() -> None:
    with pytest.raises(ConfigError, match="needs a multi-agent env"):
        Trainer("ppo", "CartPole-v1", {**SMALL, "policies": {"a": None}})
    with pytest.raises(ConfigError, match="needs a multi-agent env"):
        Trainer("ppo_dqn", "CartPole-v1", SMALL)


@pytest.mark.parametrize(
    "num_workers", [2, 0]
)  # 0: both sub-flows pull the driver's rollouts, never waiting on an actor
def test_ppo_dqn_plan_composes_the_two_sub_flows(num_workers: int) -> None:
    config = {
        **SMALL,
        "num_workers": num_workers,
        "ppo": {"train_batch_size": 160, "sgd_minibatch_size": 40, "num_sgd_iter": 2},
        "dqn": {"learning_starts": 100},
    }
    trainer = Trainer("ppo_dqn", "MultiAgentCartPole", config)
    try:
        labels = [stage.label for stage in trainer.plan.graph.operators.values()]
        for expected in (
            "duplicate[0]",
            "duplicate[1]",
            "for_each(SelectExperiences)",
            "for_each(StoreToReplayBuffer)",
            "replay",
            "for_each(UpdateTargetNetwork)",
            "for_each(StandardizeFields)",
            "for_each(UpdateKL)",
            "union[async]",
        ):
            assert any(label.startswith(expected) for label in labels), (expected, labels)
        local = trainer.workers.local_worker()
        assert (
            type(local.get_policy("dqn_policy").model).__name__ != type(local.get_policy("ppo_policy").model).__name__
        )
        learned: set[str] = set()
        for _ in range(10):
            result = trainer.train()
            learned |= set(result["info"]["learner"])
            if learned == {"ppo_policy", "dqn_policy"}:
                break
        assert learned == {"ppo_policy", "dqn_policy"}
        assert set(result["policy_reward_mean"]) == {"ppo_policy", "dqn_policy"}
    finally:
        trainer.stop()


def test_a_pettingzoo_parallel_env_trains() -> None:
    pytest.importorskip("pettingzoo")
    from pettingzoo.utils.conversions import parallel_wrapper_fn  # noqa: F401 - the package's own API is there

    from flowrl.envs import register_env

    register_env("PZCooperative", _pettingzoo_env)
    trainer = Trainer(
        "ppo", "PZCooperative", {**SMALL, "train_batch_size": 80, "sgd_minibatch_size": 40, "num_sgd_iter": 1}
    )
    try:
        for _ in range(3):
            result = trainer.train()
        assert result["timesteps_total"] >= 240 and result["info"]["num_steps_trained"] > 0
    finally:
        trainer.stop()


def _pettingzoo_env(env_config: dict[str, Any]) -> Any:
    """A two-agent pettingzoo.ParallelEnv: each agent is rewarded for repeating its observation bit."""
    from gymnasium import spaces
    from pettingzoo import ParallelEnv

    class Echo(ParallelEnv):
        metadata = {"name": "echo_v0"}

        def __init__(self) -> None:
            self.possible_agents = ["p0", "p1"]
            self.rng = np.random.default_rng(0)

        def observation_space(self, agent: str) -> spaces.Space:
            return spaces.Box(0.0, 1.0, (1,), np.float32)

        def action_space(self, agent: str) -> spaces.Space:
            return spaces.Discrete(2)

        def _obs(self) -> dict[str, np.ndarray]:
            self.bits = {a: int(self.rng.integers(2)) for a in self.agents}
            return {a: np.array([b], np.float32) for a, b in self.bits.items()}

        def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
            if seed is not None:
                self.rng = np.random.default_rng(seed)
            self.agents, self.t = list(self.possible_agents), 0
            return self._obs(), {a: {} for a in self.agents}

        def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
            rewards = {a: float(actions[a] == self.bits[a]) for a in self.agents}
            self.t += 1
            done = self.t >= 10
            obs = self._obs()
            terms = {a: False for a in self.agents}
            truncs = {a: done for a in self.agents}
            infos = {a: {} for a in self.agents}
            if done:
                self.agents = []
            return obs, rewards, terms, truncs, infos

    return Echo()


def test_ppo_dqn_config_says_where_misplaced_keys_belong() -> None:
    from flowrl.algorithms.ppo_dqn import PPODQNConfig

    with pytest.raises(ConfigError) as info:
        PPODQNConfig.from_dict({"lr": 0.1, "ppo": {"rollout_fragment_length": 7}, "policies_to_train": ["ppo_policy"]})
    assert info.value.problems == [
        "policies_to_train=['ppo_policy']: ppo_dqn trains both of its policies",
        "lr=0.1 applies to neither policy in ppo_dqn; set ppo.lr or dqn.lr",
        "ppo['rollout_fragment_length']: a sampling key shared by both policies; "
        "set rollout_fragment_length at the top level",
    ]
    with pytest.raises(ConfigError, match="cannot import 'no.such:fn'"):
        PPODQNConfig.from_dict({"policy_mapping_fn": "no.such:fn"})
    config = PPODQNConfig.from_dict({"seed": 3, "rollout_fragment_length": 20, "dqn": {"lr": 0.01}})
    assert (config.dqn_config().lr, config.dqn_config().rollout_fragment_length, config.ppo_config().seed) == (
        0.01,
        20,
        3,
    )


def test_single_agent_algorithms_refuse_a_multi_agent_env_before_any_actor_starts() -> None:
    with pytest.raises(
        ConfigError, match=r"algorithm 'impala' trains single-agent envs.*multi-agent envs: a2c, dqn, pg, ppo, ppo_dqn"
    ):
        Trainer("impala", "MultiAgentCartPole", SMALL)


@pytest.mark.parametrize("algo", ["pg", "a2c", "dqn"])
def test_other_multi_agent_algorithms_train_two_policies(algo: str) -> None:
    config = {**SMALL, "policies": {"even": None, "odd": None}, "policy_mapping_fn": by_parity}
    if algo == "dqn":
        config |= {"learning_starts": 50, "train_batch_size": 16}
    else:
        config |= {"train_batch_size": 80}
    trainer = Trainer(algo, "MultiAgentCartPole", config)
    try:
        learned: set[str] = set()
        for _ in range(5):
            learned |= set(trainer.train()["info"]["learner"])
        assert learned == {"even", "odd"}
    finally:
        trainer.stop()


def test_a_plan_that_fails_to_build_leaves_no_actors_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    from flowrl.actors import WorkerSet

    created: list[list[Any]] = []
    original_init = WorkerSet.__init__

    def recording_init(self: WorkerSet, **kwargs: Any) -> None:
        original_init(self, **kwargs)
        created.append(self.remote_workers())

    monkeypatch.setattr(WorkerSet, "__init__", recording_init)
    config = {**SMALL, "policies": {"even": None, "odd": None}, "policy_mapping_fn": by_parity, "microbatch_size": 20}
    with pytest.raises(ConfigError, match="microbatch_size=20 accumulates the gradients of one policy"):
        Trainer("a2c", "MultiAgentCartPole", config)
    [remote] = created
    assert len(remote) == 2
    for actor in remote:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.ping.remote(), timeout=30)


def test_a_checkpoint_keeps_a_lambda_mapping_and_restores(tmp_path: Any) -> None:
    from flowrl.engine.build import evaluate_checkpoint

    config = {
        **SMALL,
        "train_batch_size": 80,
        "sgd_minibatch_size": 40,
        "num_sgd_iter": 1,
        "policies": {"even": None, "odd": None},
        "policy_mapping_fn": lambda agent: ["even", "odd"][agent % 2],
    }
    trainer = Trainer("ppo", "MultiAgentCartPole", config)
    try:
        trainer.train()
        path = trainer.save(tmp_path)
        weights = trainer.workers.local_worker().get_policy("odd").get_weights()
    finally:
        trainer.stop()
    restored = Trainer.from_checkpoint(path)
    try:
        assert restored.config.policy_mapping_fn(3) == "odd"
        restored_weights = restored.workers.local_worker().get_policy("odd").get_weights()
        assert all(np.array_equal(weights[k], restored_weights[k]) for k in weights)
    finally:
        restored.stop()
    assert set(evaluate_checkpoint(path, num_episodes=1, seed=0)["policy_reward_mean"]) == {"even", "odd"}
