"""MultiAgentSampler: policy mapping, per-agent trajectories, agents finishing apart, counters (no Ray)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from fakes import bc_loss
from gymnasium import spaces

from flowrl.actors import RolloutWorker
from flowrl.actors.sampling.multi_agent import MultiAgentSampler
from flowrl.config import TrainerConfig
from flowrl.data import MultiAgentBatch, SampleBatch
from flowrl.envs import MultiAgentEnv, get_env_creator
from flowrl.errors import FlowRLError
from flowrl.policy import PolicySpec, TorchPolicy
from flowrl.policy.mapping import policy_mapping

pytestmark = pytest.mark.unit


class StaggeredEnv(MultiAgentEnv):
    """Agent 'a' lives 3 steps and 'b' 5; each gets reward 1 (a) or 2 (b) per step; obs = [step, agent]."""

    LIFETIMES = {"a": 3, "b": 5}

    def __init__(self, env_config: dict | None = None) -> None:
        self.possible_agents = ["a", "b"]
        self.agents: list[str] = []
        self.t = 0

    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Box(-100.0, 100.0, (2,), np.float32)

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(2)

    def _obs(self, agent: str) -> np.ndarray:
        return np.array([self.t, self.possible_agents.index(agent)], np.float32)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.t = 0
        self.agents = list(self.possible_agents)
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        assert set(actions) == set(self.agents), (actions, self.agents)
        self.t += 1
        obs = {a: self._obs(a) for a in self.agents}
        rewards = {a: 1.0 if a == "a" else 2.0 for a in self.agents}
        terminated = {a: self.t >= self.LIFETIMES[a] for a in self.agents}
        truncated = {a: False for a in self.agents}
        self.agents = [a for a in self.agents if not terminated[a]]
        return obs, rewards, terminated, truncated, {a: {} for a in obs}


class StubPolicy:
    """Acts 1 always; records the observation batches it was asked about; marks postprocessed pieces."""

    def __init__(self) -> None:
        self.action_space = spaces.Discrete(2)
        self.seen: list[np.ndarray] = []

    def compute_actions(self, obs_batch: np.ndarray, **_: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        self.seen.append(obs_batch)
        return np.ones(len(obs_batch), np.int64), {"action_logp": np.zeros(len(obs_batch), np.float32)}

    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        batch["piece_len"] = np.full(batch.count, batch.count)
        return batch


def sampler(mapping: Any, fragment_length: int, num_envs: int = 1) -> tuple[MultiAgentSampler, dict[str, StubPolicy]]:
    policies = {"pa": StubPolicy(), "pb": StubPolicy()}
    envs = [StaggeredEnv() for _ in range(num_envs)]
    return MultiAgentSampler(envs, policies, mapping, fragment_length=fragment_length), policies


def by_agent(agent: str) -> str:
    return "pa" if agent == "a" else "pb"


def test_agents_finishing_at_different_times_get_their_own_trajectories() -> None:
    s, policies = sampler(by_agent, fragment_length=5)
    batch = s.sample()
    assert isinstance(batch, MultiAgentBatch)
    assert batch.env_steps() == 5 and batch.agent_steps() == 3 + 5
    a, b = batch.policy_batches["pa"], batch.policy_batches["pb"]
    assert a[SampleBatch.T].tolist() == [0, 1, 2] and a[SampleBatch.TERMINATEDS].tolist() == [False, False, True]
    assert b[SampleBatch.T].tolist() == [0, 1, 2, 3, 4] and b[SampleBatch.TERMINATEDS][-1]
    assert a["piece_len"].tolist() == [3] * 3 and b["piece_len"].tolist() == [5] * 5  # postprocessed per agent piece
    assert (a[SampleBatch.AGENT_INDEX] == 0).all() and (b[SampleBatch.AGENT_INDEX] == 1).all()
    np.testing.assert_array_equal(a[SampleBatch.NEW_OBS][:, 0], [1, 2, 3])
    # Once 'a' left, only 'b' was asked for actions.
    assert [len(x) for x in policies["pa"].seen] == [1, 1, 1] and [len(x) for x in policies["pb"].seen] == [1] * 5
    [episode] = s.pop_episode_stats()
    assert (episode.episode_reward, episode.episode_length) == (3 * 1.0 + 5 * 2.0, 5)
    assert episode.policy_rewards == {"pa": [3.0], "pb": [10.0]}


def test_a_fragment_cut_leaves_the_rest_of_each_trajectory_for_the_next_fragment() -> None:
    s, _ = sampler(by_agent, fragment_length=2)
    first, second, third = s.sample(), s.sample(), s.sample()
    assert first.policy_batches["pb"][SampleBatch.T].tolist() == [0, 1]
    assert not first.policy_batches["pb"][SampleBatch.TERMINATEDS].any()  # cut, not ended: bootstrapped later
    assert (
        second.policy_batches["pa"][SampleBatch.T].tolist() == [2]
        and second.policy_batches["pa"][SampleBatch.TERMINATEDS][0]
    )
    # 'b' ends its episode at t=4; both agents start the next one in the same fragment.
    assert third.policy_batches["pb"][SampleBatch.T].tolist() == [4, 0]
    assert third.policy_batches["pa"][SampleBatch.T].tolist() == [0]
    eps = [
        b[SampleBatch.EPS_ID].tolist()
        for b in (first.policy_batches["pb"], second.policy_batches["pb"], third.policy_batches["pb"])
    ]
    assert eps[0][0] == eps[1][0] == eps[2][0] != eps[2][1]  # one episode of 'b' over three fragments, then the next


def test_one_forward_pass_per_policy_per_step_across_envs() -> None:
    s, policies = sampler(lambda agent: "pa", fragment_length=1, num_envs=3)
    s.sample()
    assert [x.shape for x in policies["pa"].seen] == [(6, 2)]  # 3 envs x 2 agents in one batch
    assert policies["pb"].seen == []


def test_a_mapping_to_an_unknown_policy_names_the_agent() -> None:
    with pytest.raises(FlowRLError, match=r"policy_mapping_fn\('a'\) returned 'nope'.*\['pa', 'pb'\]"):
        sampler(lambda agent: "nope", fragment_length=1)[0].sample()


def test_no_mapping_needs_a_single_policy() -> None:
    assert policy_mapping(None, ["only"])("any agent") == "only"
    with pytest.raises(FlowRLError, match="policy_mapping_fn"):
        policy_mapping(None, ["p1", "p2"])
    assert policy_mapping("flowrl.algorithms.ppo_dqn:even_ppo_odd_dqn", [])(3) == "dqn_policy"


def test_a_rollout_worker_on_a_multi_agent_env_counts_env_and_agent_steps() -> None:
    env = get_env_creator("MultiAgentCartPole")({})
    spec = PolicySpec(TorchPolicy, env.observation_space(0), env.action_space(0), TrainerConfig(), {"loss_fn": bc_loss})
    worker = RolloutWorker(
        env_creator=get_env_creator("MultiAgentCartPole"),
        policy_specs={"even": spec, "odd": spec},
        config={
            "seed": 0,
            "rollout_fragment_length": 30,
            "num_envs_per_worker": 2,
            "policy_mapping_fn": lambda a: ["even", "odd"][a % 2],
        },
    )
    batch = worker.sample()
    assert batch.env_steps() == 60
    assert batch.agent_steps() == sum(b.count for b in batch.policy_batches.values()) > 60
    assert set(np.unique(batch.policy_batches["even"][SampleBatch.AGENT_INDEX])) <= {0, 2}
    assert set(np.unique(batch.policy_batches["odd"][SampleBatch.AGENT_INDEX])) <= {1, 3}
    # Two policies from one spec start from different weights (distinct seeds per policy).
    w_even, w_odd = worker.get_policy("even").get_weights(), worker.get_policy("odd").get_weights()
    assert any(not np.array_equal(w_even[k], w_odd[k]) for k in w_even)
    with pytest.raises(FlowRLError, match="truncate_episodes"):
        RolloutWorker(
            env_creator=get_env_creator("MultiAgentCartPole"),
            policy_specs={"even": spec},
            config={"batch_mode": "complete_episodes"},
        )


class LateJoinerEnv(StaggeredEnv):
    """'a' acts from the start; 'b' enters after the second step; the episode is truncated for both at t=5."""

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.t = 0
        self.agents = ["a"]
        return {"a": self._obs("a")}, {"a": {}}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        assert set(actions) == set(self.agents), (actions, self.agents)
        acted = list(self.agents)
        self.t += 1
        rewards = {a: 1.0 for a in acted}
        done = self.t >= 5
        terminated = {a: False for a in acted}
        truncated = {a: done for a in acted}
        self.agents = [] if done else (["a", "b"] if self.t >= 2 else ["a"])
        obs = {a: self._obs(a) for a in set(acted) | set(self.agents)}
        return obs, rewards, terminated, truncated, {a: {} for a in obs}


def test_an_agent_entering_mid_episode_starts_its_trajectory_there() -> None:
    policies = {"pa": StubPolicy(), "pb": StubPolicy()}
    s = MultiAgentSampler([LateJoinerEnv()], policies, by_agent, fragment_length=5)  # type: ignore[arg-type]
    batch = s.sample()
    a, b = batch.policy_batches["pa"], batch.policy_batches["pb"]
    assert a[SampleBatch.T].tolist() == [0, 1, 2, 3, 4] and b[SampleBatch.T].tolist() == [2, 3, 4]
    assert a[SampleBatch.TRUNCATEDS][-1] and b[SampleBatch.TRUNCATEDS][-1]
    assert batch.env_steps() == 5 and batch.agent_steps() == 8
    [episode] = s.pop_episode_stats()
    assert episode.policy_rewards == {"pa": [5.0], "pb": [3.0]} and episode.episode_length == 5


class RewardOnJoinEnv(LateJoinerEnv):
    """Like LateJoinerEnv, and 'b' gets a reward of 5 in the step it joins (before it has acted)."""

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        obs, rewards, terminated, truncated, infos = super().step(actions)
        if self.t == 2:
            rewards["b"] = 5.0
        return obs, rewards, terminated, truncated, infos


def test_a_reward_given_before_an_agent_acts_goes_into_its_next_row_and_its_return() -> None:
    policies = {"pa": StubPolicy(), "pb": StubPolicy()}
    s = MultiAgentSampler([RewardOnJoinEnv()], policies, by_agent, fragment_length=5)  # type: ignore[arg-type]
    b = s.sample().policy_batches["pb"]
    assert b[SampleBatch.REWARDS].tolist() == [6.0, 1.0, 1.0]
    [episode] = s.pop_episode_stats()
    assert episode.policy_rewards == {"pa": [5.0], "pb": [8.0]} and episode.episode_reward == 13.0
