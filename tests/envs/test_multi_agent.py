"""The multi-agent env layer: the Parallel API, built-in envs, check_multi_agent_env, registry names, PettingZoo."""

from __future__ import annotations

import pickle
from typing import ClassVar

import cloudpickle
import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

from flowrl.envs import (
    CooperativeMatching,
    MultiAgentCartPole,
    MultiAgentEnv,
    TurnBasedEnv,
    check_multi_agent_env,
    env_spaces,
    get_env_creator,
    is_multi_agent_env,
    make_env,
    multi_agent_env_spaces,
    register_env,
    registry,
)
from flowrl.errors import EnvCheckError, EnvError, UnknownEnvError

pytestmark = pytest.mark.unit


def balance(obs: np.ndarray) -> int:
    """A CartPole controller that keeps the pole up for the full 500 steps from the seeds used here."""
    return int(obs[2] + 0.5 * obs[3] > 0)


# ---- the built-in envs


@pytest.mark.parametrize(
    "env",
    [
        MultiAgentCartPole(),
        MultiAgentCartPole({"num_agents": 1}),
        CooperativeMatching(),
        CooperativeMatching({"num_cues": 5, "episode_length": 3}),
    ],
    ids=["cartpole-4", "cartpole-1", "matching", "matching-5-cues"],
)
def test_builtin_envs_pass_the_checker(env: MultiAgentEnv) -> None:
    assert is_multi_agent_env(env)
    check_multi_agent_env(env, num_steps=200)


def test_multi_agent_cartpole_api() -> None:
    env = MultiAgentCartPole()
    assert env.possible_agents == [0, 1, 2, 3] and env.max_num_agents == 4
    assert env.observation_space(2) == gymnasium.make("CartPole-v1").observation_space
    assert env.action_space(2) == spaces.Discrete(2)
    assert env.action_space(1) is env.action_space(1)
    obs, infos = env.reset(seed=0)
    assert set(obs) == set(infos) == {0, 1, 2, 3} and env.agents == [0, 1, 2, 3]
    obs, rewards, terminations, truncations, infos = env.step({agent: 0 for agent in env.agents})
    for result in (obs, rewards, terminations, truncations, infos):
        assert set(result) == {0, 1, 2, 3}
    assert rewards == {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}
    with pytest.raises(EnvError, match=r"action_space\(7\): unknown agent; the agents are \[0, 1, 2, 3\]"):
        env.action_space(7)
    env.close()


def test_cartpole_agents_leave_at_different_times_and_need_actions_only_while_live() -> None:
    env = MultiAgentCartPole({"num_agents": 3})
    obs, _ = env.reset(seed=0)
    # Agent 0 always pushes left and falls within a few steps; agent 1 balances; agent 2 always pushes right.
    policy = {0: lambda o: 0, 1: balance, 2: lambda o: 1}
    left_at: dict[int, int] = {}
    t = 0
    while env.agents:
        live = list(env.agents)
        obs, rewards, terminations, truncations, infos = env.step({a: policy[a](obs[a]) for a in live})
        t += 1
        for result in (obs, rewards, terminations, truncations, infos):
            assert list(result) == live  # keyed by the agents that acted, finishing ones included
        for agent in live:
            if terminations[agent] or truncations[agent]:
                left_at[agent] = t
                assert agent not in env.agents
            else:
                assert agent in env.agents
        if 0 in left_at and 1 in env.agents and t == left_at[0]:
            with pytest.raises(EnvError, match=r"got an action for agent 0, which is not live"):
                env.step({a: 0 for a in [0, *env.agents]})
            with pytest.raises(EnvError, match=r"got no action for live agent 1"):
                env.step({a: 0 for a in env.agents if a != 1} | {"x": 0})
    assert left_at[0] < 20 and left_at[2] < 20
    assert left_at[1] == 500  # agent 1 is truncated by its own 500-step limit, long after the others fell
    assert env.agents == []
    with pytest.raises(EnvError, match=r"the episode is over \(env.agents is empty\); call reset\(\)"):
        env.step({})
    obs, _ = env.reset()
    assert env.agents == [0, 1, 2]


def test_cartpole_seeding() -> None:
    first, second = MultiAgentCartPole(), MultiAgentCartPole()
    obs_a, _ = first.reset(seed=11)
    obs_b, _ = second.reset(seed=11)
    for agent in range(4):
        np.testing.assert_array_equal(obs_a[agent], obs_b[agent])
        # Agent i's CartPole is seeded with seed + i.
        expected, _ = gymnasium.make("CartPole-v1").reset(seed=11 + agent)
        np.testing.assert_array_equal(obs_a[agent], expected)
    other, _ = second.reset(seed=12)
    np.testing.assert_array_equal(other[0], obs_a[1])
    assert not np.array_equal(other[3], obs_a[3])


def test_cooperative_matching_rewards_are_shared_and_episodes_bounded() -> None:
    env = CooperativeMatching({"num_cues": 4, "episode_length": 3})
    assert env.possible_agents == ["agent_0", "agent_1"]
    assert env.observation_space("agent_0") == spaces.Box(0.0, 1.0, (4,), np.float32)
    obs, _ = env.reset(seed=3)
    cue = int(np.argmax(obs["agent_0"]))
    np.testing.assert_array_equal(obs["agent_0"], obs["agent_1"])
    obs, rewards, terminations, _, _ = env.step({"agent_0": cue, "agent_1": cue})
    assert rewards == {"agent_0": 1.0, "agent_1": 1.0} and terminations == {"agent_0": False, "agent_1": False}
    cue = int(np.argmax(obs["agent_1"]))
    _, rewards, _, _, _ = env.step({"agent_0": cue, "agent_1": (cue + 1) % 4})
    assert rewards == {"agent_0": 0.5, "agent_1": 0.5}
    obs, rewards, terminations, truncations, _ = env.step({"agent_0": 0, "agent_1": 0})
    assert terminations == {"agent_0": True, "agent_1": True} and truncations == {"agent_0": False, "agent_1": False}
    assert env.agents == [] and set(obs) == {"agent_0", "agent_1"}


def test_cooperative_matching_is_determined_by_its_seed() -> None:
    def cues(seed: int) -> list[int]:
        env = CooperativeMatching({"episode_length": 20})
        obs, _ = env.reset(seed=seed)
        seen = [int(np.argmax(obs["agent_0"]))]
        while env.agents:
            obs, *_ = env.step({"agent_0": 0, "agent_1": 1})
            seen.append(int(np.argmax(obs["agent_0"])))
        return seen

    assert cues(5) == cues(5)
    assert cues(5) != cues(6)


@pytest.mark.parametrize(
    "env_class, env_config, expected",
    [
        (
            MultiAgentCartPole,
            {"num_agent": 2},
            r"MultiAgentCartPole got unknown env_config keys \['num_agent'\]; valid keys are \['num_agents'\]",
        ),
        (MultiAgentCartPole, {"num_agents": 0}, r"env_config\['num_agents'\]=0; it must be an int >= 1"),
        (CooperativeMatching, {"num_cues": 2.5}, r"env_config\['num_cues'\]=2.5; it must be an int >= 1"),
    ],
)
def test_builtin_envs_validate_env_config(env_class: type, env_config: dict, expected: str) -> None:
    with pytest.raises(EnvError, match=expected):
        env_class(env_config)


def test_is_multi_agent_env() -> None:
    assert is_multi_agent_env(MultiAgentCartPole())
    assert not is_multi_agent_env(MultiAgentCartPole)  # the class is a creator, not an env
    assert not is_multi_agent_env(gymnasium.make("CartPole-v1"))
    assert not is_multi_agent_env(object())


# ---- check_multi_agent_env: one broken env per kind of fault


class ProbeEnv(MultiAgentEnv):
    """A valid env: agents "a" (done after 3 steps) and "b" (done after 5); subclasses break one thing each."""

    lengths: ClassVar[dict[str, int]] = {"a": 3, "b": 5}

    def __init__(self) -> None:
        self.possible_agents = ["a", "b"]
        self.agents = []
        self._obs_space = {agent: spaces.Box(-1.0, 1.0, (2,), np.float32) for agent in self.possible_agents}
        self._act_space = {agent: spaces.Discrete(3) for agent in self.possible_agents}
        self.rng = np.random.default_rng()
        self.t = 0

    def observation_space(self, agent):
        return self._obs_space[agent]

    def action_space(self, agent):
        return self._act_space[agent]

    def observe(self, agent):
        return self.rng.uniform(-1, 1, 2).astype(np.float32)

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        self.agents = list(self.possible_agents)
        return {agent: self.observe(agent) for agent in self.agents}, {agent: {} for agent in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents), (actions, self.agents)
        self.t += 1
        obs = {agent: self.observe(agent) for agent in self.agents}
        rewards = {agent: 1.0 for agent in self.agents}
        terminations = {agent: self.t >= self.lengths[agent] for agent in self.agents}
        truncations = {agent: False for agent in self.agents}
        infos = {agent: {} for agent in self.agents}
        self.agents = [agent for agent in self.agents if not terminations[agent]]
        return obs, rewards, terminations, truncations, infos


def check_message(env, **kwargs) -> str:
    with pytest.raises(EnvCheckError) as info:
        check_multi_agent_env(env, **kwargs)
    return str(info.value)


def test_probe_env_passes() -> None:
    check_multi_agent_env(ProbeEnv(), num_steps=30)


def test_agents_joining_mid_episode_and_omitted_infos_pass() -> None:
    class LateJoiner(ProbeEnv):
        """Agent "b" joins after the first step; no agent ever gets an info entry."""

        def reset(self, seed=None, options=None):
            obs, _ = super().reset(seed=seed)
            self.agents = ["a"]
            return {"a": obs["a"]}, {}

        def step(self, actions):
            self.t += 1
            if self.t == 1:
                self.agents.append("b")
            obs = {agent: self.observe(agent) for agent in self.agents}
            terminations = {agent: self.t >= self.lengths[agent] for agent in self.agents}
            truncations = dict.fromkeys(self.agents, False)
            rewards = dict.fromkeys(self.agents, 0.0)
            self.agents = [agent for agent in self.agents if not terminations[agent]]
            return obs, rewards, terminations, truncations, {}

    check_multi_agent_env(LateJoiner(), num_steps=20)


def test_a_gymnasium_env_is_sent_to_check_env() -> None:
    assert "single-agent env; check it with flowrl.envs.check_env" in check_message(gymnasium.make("CartPole-v1"))


def test_missing_possible_agents() -> None:
    env = ProbeEnv()
    del env.possible_agents
    assert check_message(env).startswith("env has no possible_agents")


def test_repeated_possible_agents() -> None:
    env = ProbeEnv()
    env.possible_agents = ["a", "b", "a"]
    assert "env.possible_agents repeats the agent ids 'a'" in check_message(env)


def test_space_that_is_not_a_gymnasium_space_names_the_agent() -> None:
    env = ProbeEnv()
    env._act_space["b"] = [0, 1, 2]
    assert "env.action_space('b') returned [0, 1, 2] of type list, but it must be a gymnasium.spaces.Space" in (
        check_message(env)
    )


def test_space_that_changes_between_calls() -> None:
    class ShiftingSpaces(ProbeEnv):
        calls = 0

        def observation_space(self, agent):
            self.calls += 1
            return spaces.Box(-1.0, float(self.calls), (2,), np.float32)

    message = check_message(ShiftingSpaces())
    assert (
        message.startswith("env.observation_space('a') returned Box(") and "an agent's space must not change" in message
    )


def test_a_space_rebuilt_equal_on_every_call_is_fine() -> None:
    class FreshSpaces(ProbeEnv):
        def observation_space(self, agent):
            return spaces.Box(-100.0, 100.0, (2,), np.float32)

    check_multi_agent_env(FreshSpaces())


def test_space_lookup_that_raises_names_the_agent() -> None:
    env = ProbeEnv()
    env.possible_agents = ["a", "b", "c"]
    message = check_message(env)
    assert message.startswith("env.observation_space('c') raised KeyError: 'c'")


def test_reset_without_a_seed_keyword() -> None:
    class NoSeed(ProbeEnv):
        def reset(self):
            return super().reset()

    message = check_message(NoSeed())
    assert message.startswith("env.reset() does not accept the keyword seed; PettingZoo's Parallel API is reset(")


def test_reset_returning_only_observations() -> None:
    class BareReset(ProbeEnv):
        def reset(self, seed=None, options=None):
            return super().reset(seed=seed)[0]

    message = check_message(BareReset(), seed=4)
    assert message.startswith("env.reset(seed=4) returned {'a': ")
    assert "the Parallel API's reset returns the pair (obs, infos)" in message


def test_reset_observation_missing_an_agent() -> None:
    class MissingObs(ProbeEnv):
        def reset(self, seed=None, options=None):
            obs, infos = super().reset(seed=seed)
            del obs["b"]
            return obs, infos

    assert "env.reset(seed=0) returned obs without agent 'b'" in check_message(MissingObs())


def test_reset_observation_out_of_bounds_names_agent_field_and_bound() -> None:
    class Above(ProbeEnv):
        def observe(self, agent):
            return np.array([0.0, 3.0 if agent == "b" else 0.0], dtype=np.float32)

    message = check_message(Above())
    assert message == (
        "env.reset(seed=0) returned observation with obs['b'][1]=3.0 above observation_space('b').high[1]=1.0 "
        "for agent 'b'"
    )


def test_reset_leaving_no_agents() -> None:
    class NoAgents(ProbeEnv):
        def reset(self, seed=None, options=None):
            super().reset(seed=seed)
            self.agents = []
            return {}, {}

    assert "env.reset(seed=0) left env.agents empty" in check_message(NoAgents())


def test_reset_that_ignores_seed() -> None:
    class Unseeded(ProbeEnv):
        def reset(self, seed=None, options=None):
            return super().reset(seed=None)

    assert check_message(Unseeded(), seed=2).startswith("env.reset(seed=2) ignores seed")


def test_agent_not_in_possible_agents() -> None:
    class Stranger(ProbeEnv):
        def reset(self, seed=None, options=None):
            obs, infos = super().reset(seed=seed)
            self.agents.append("z")
            return obs, infos

    assert "after env.reset(seed=0), env.agents holds ['z'], not in env.possible_agents" in check_message(Stranger())


def test_old_four_value_step() -> None:
    class OldStep(ProbeEnv):
        def step(self, actions):
            obs, rewards, terminations, _, infos = super().step(actions)
            return obs, rewards, terminations, infos

    message = check_message(OldStep())
    assert message.startswith("env.step() returned 4 values (obs, rewards, dones, infos), the old API")
    assert "(step 1 of check_multi_agent_env)" in message


def test_step_field_that_is_not_a_dict() -> None:
    class ListRewards(ProbeEnv):
        def step(self, actions):
            obs, rewards, *rest = super().step(actions)
            return (obs, list(rewards.values()), *rest)

    assert "env.step() returned rewards [1.0, 1.0] of type list; rewards must be a dict keyed by agent" in (
        check_message(ListRewards())
    )


@pytest.mark.parametrize(
    "reward, expected",
    [
        (float("nan"), "env.step() returned rewards['b']=nan; each reward must be a finite real scalar"),
        (np.array([1.0, 2.0]), "env.step() returned rewards['b']=[1., 2.] of type ndarray"),
        (True, "env.step() returned rewards['b']=True of type bool"),
    ],
)
def test_reward_must_be_a_finite_real_scalar(reward: object, expected: str) -> None:
    class BadReward(ProbeEnv):
        def step(self, actions):
            obs, rewards, *rest = super().step(actions)
            rewards["b"] = reward
            return (obs, rewards, *rest)

    assert expected in check_message(BadReward())


def test_termination_flag_must_be_a_bool() -> None:
    class IntFlags(ProbeEnv):
        def step(self, actions):
            obs, rewards, terminations, *rest = super().step(actions)
            terminations = {agent: int(flag) for agent, flag in terminations.items()}
            return (obs, rewards, terminations, *rest)

    message = check_message(IntFlags())
    assert "env.step() returned terminations['a']=0 of type int; each entry of terminations must be a bool" in message


def test_finished_agent_must_leave_agents() -> None:
    class Lingering(ProbeEnv):
        def step(self, actions):
            live = list(self.agents)
            result = super().step(actions)
            self.agents = live  # forgets to remove the finished agent
            return result

    message = check_message(Lingering())
    assert message.startswith("after env.step() returned terminations['a']=True, agent 'a' is still in env.agents")
    assert "(step 3 of check_multi_agent_env)" in message


def test_agent_must_not_leave_without_finishing() -> None:
    class Vanishing(ProbeEnv):
        def step(self, actions):
            result = super().step(actions)
            if self.t == 2:
                self.agents.remove("b")
            return result

    message = check_message(Vanishing())
    assert "after env.step(), agent 'b' left env.agents although terminations['b'] and truncations['b'] are False" in (
        message
    )


def test_step_result_for_an_agent_that_is_not_live() -> None:
    class Ghost(ProbeEnv):
        def step(self, actions):
            obs, *rest = super().step(actions)
            obs.setdefault("a", np.zeros(2, np.float32))  # an observation for "a" after it finished
            return (obs, *rest)

    message = check_message(Ghost())
    assert message.startswith("env.step() returned obs for agent 'a', which is not live")
    assert "(step 4 of check_multi_agent_env)" in message


def test_step_result_missing_a_live_agent() -> None:
    class NoReward(ProbeEnv):
        def step(self, actions):
            obs, rewards, *rest = super().step(actions)
            rewards.pop("b")
            return (obs, rewards, *rest)

    assert "env.step() returned rewards without agent 'b'" in check_message(NoReward())


def test_finished_agent_cannot_come_back() -> None:
    class Revived(ProbeEnv):
        def step(self, actions):
            result = super().step(actions)
            if self.t == 4:
                self.agents.append("a")
            return result

    message = check_message(Revived())
    assert message.startswith("after env.step(), env.agents holds agent 'a', which finished earlier in the episode")


def test_step_observation_with_wrong_dtype_names_the_agent() -> None:
    class Float64(ProbeEnv):
        def step(self, actions):
            obs, *rest = super().step(actions)
            obs["a"] = obs["a"].astype(np.float64)
            return (obs, *rest)

    message = check_message(Float64())
    assert message.startswith(
        "env.step() returned observation with dtype float64 but observation_space('a').dtype is float32"
    )
    assert "for agent 'a' (step 1 of check_multi_agent_env)" in message


def test_step_info_must_be_a_dict_per_agent() -> None:
    class BadInfo(ProbeEnv):
        def step(self, actions):
            *head, infos = super().step(actions)
            infos["a"] = None
            return (*head, infos)

    assert "env.step() returned infos['a']=None of type NoneType; each agent's info must be a dict" in (
        check_message(BadInfo())
    )


def test_step_that_raises_names_the_actions() -> None:
    class Crashes(ProbeEnv):
        def step(self, actions):
            raise ValueError("bad action")

    with pytest.raises(EnvCheckError) as info:
        check_multi_agent_env(Crashes())
    assert str(info.value).startswith("env.step({'a': ")
    assert "raised ValueError: bad action (step 1 of check_multi_agent_env)" in str(info.value)
    assert isinstance(info.value.__cause__, ValueError)


# ---- registry


@pytest.mark.parametrize(
    "name, env_class", [("MultiAgentCartPole", MultiAgentCartPole), ("CooperativeMatching", CooperativeMatching)]
)
def test_builtin_names_resolve_to_picklable_creators(name: str, env_class: type) -> None:
    creator = get_env_creator(name)
    assert creator is env_class
    for dumps, loads in ((cloudpickle.dumps, cloudpickle.loads), (pickle.dumps, pickle.loads)):
        assert isinstance(loads(dumps(creator))({}), env_class)
    env = make_env(name)
    assert isinstance(env, env_class)
    check_multi_agent_env(env)


def test_make_env_passes_env_config_and_seeds_every_agent_action_space() -> None:
    env = make_env("MultiAgentCartPole", {"num_agents": 2}, seed=3)
    assert env.possible_agents == [0, 1]
    again = make_env("MultiAgentCartPole", {"num_agents": 2}, seed=3)
    samples = {agent: [env.action_space(agent).sample() for _ in range(30)] for agent in (0, 1)}
    for agent in (0, 1):
        assert samples[agent] == [again.action_space(agent).sample() for _ in range(30)]
    assert samples[0] != samples[1]  # agent i's action space is seeded with seed + i
    with pytest.raises(EnvError, match=r"MultiAgentCartPole env_config\['num_agents'\]=-1; it must be an int >= 1"):
        make_env("MultiAgentCartPole", {"num_agents": -1})


def test_env_spaces_refuses_a_multi_agent_env_and_multi_agent_env_spaces_reads_it() -> None:
    with pytest.raises(
        EnvError,
        match=r"env 'MultiAgentCartPole' is a multi-agent env with agents \[0, 1, 2, 3\].*"
        r"use flowrl.envs.multi_agent_env_spaces",
    ):
        env_spaces("MultiAgentCartPole")
    by_agent = multi_agent_env_spaces("CooperativeMatching", {"num_cues": 2})
    assert by_agent == {
        agent: (spaces.Box(0.0, 1.0, (2,), np.float32), spaces.Discrete(2)) for agent in ("agent_0", "agent_1")
    }
    env = MultiAgentCartPole({"num_agents": 2})
    assert multi_agent_env_spaces(env) == {a: (env.observation_space(a), env.action_space(a)) for a in (0, 1)}
    with pytest.raises(
        EnvError, match=r"env 'CartPole-v1' is a single-agent gymnasium.Env; use flowrl.envs.env_spaces"
    ):
        multi_agent_env_spaces("CartPole-v1")


def test_a_custom_multi_agent_creator_and_registered_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_REGISTRY", {})
    assert isinstance(make_env(lambda cfg: ProbeEnv()), ProbeEnv)
    register_env("MultiAgentCartPole", lambda cfg: ProbeEnv())  # a registered name shadows a built-in one
    assert isinstance(make_env("MultiAgentCartPole"), ProbeEnv)


def test_unknown_name_suggests_a_builtin_multi_agent_env() -> None:
    with pytest.raises(UnknownEnvError, match=r"unknown env 'multiagentcartpol'; did you mean 'MultiAgentCartPole'\?"):
        get_env_creator("multiagentcartpol")


def test_creator_returning_neither_kind_of_env() -> None:
    with pytest.raises(
        EnvError, match="it must return a gymnasium.Env or a multi-agent env with PettingZoo's Parallel"
    ):
        make_env(lambda cfg: object())


# ---- PettingZoo (an optional extra)


def test_a_pettingzoo_parallel_env_works_directly() -> None:
    pettingzoo = pytest.importorskip("pettingzoo")

    class Echo(pettingzoo.ParallelEnv):
        """A real PettingZoo ParallelEnv with no dependency: each agent is paid for repeating its own obs."""

        metadata: ClassVar[dict[str, str]] = {"name": "echo_v0"}

        def __init__(self) -> None:
            self.possible_agents = ["p0", "p1", "p2"]
            self._spaces = {agent: spaces.Discrete(4) for agent in self.possible_agents}
            self.rng = np.random.default_rng()

        def observation_space(self, agent):
            return self._spaces[agent]

        def action_space(self, agent):
            return self._spaces[agent]

        def reset(self, seed=None, options=None):
            if seed is not None:
                self.rng = np.random.default_rng(seed)
            self.t = 0
            self.agents = list(self.possible_agents)
            self.last = {agent: int(self.rng.integers(4)) for agent in self.agents}
            return dict(self.last), {agent: {} for agent in self.agents}

        def step(self, actions):
            self.t += 1
            rewards = {agent: float(actions[agent] == self.last[agent]) for agent in self.agents}
            self.last = {agent: int(self.rng.integers(4)) for agent in self.agents}
            # p0 leaves after 2 steps, the others after 4.
            terminations = {agent: self.t >= (2 if agent == "p0" else 4) for agent in self.agents}
            truncations = {agent: False for agent in self.agents}
            obs, infos = dict(self.last), {agent: {} for agent in self.agents}
            self.agents = [agent for agent in self.agents if not terminations[agent]]
            return obs, rewards, terminations, truncations, infos

    assert is_multi_agent_env(Echo())
    env = make_env(lambda cfg: Echo(), seed=0)
    check_multi_agent_env(env, num_steps=40)


@pytest.mark.filterwarnings("ignore:The old environment creation API:DeprecationWarning")
def test_builtin_envs_pass_pettingzoos_own_parallel_api_test() -> None:
    pytest.importorskip("pettingzoo")
    from pettingzoo.test import parallel_api_test

    parallel_api_test(MultiAgentCartPole(), num_cycles=600)
    parallel_api_test(CooperativeMatching(), num_cycles=50)


def test_pettingzoo_rock_paper_scissors() -> None:
    pytest.importorskip("pettingzoo")
    rps_v2 = pytest.importorskip("pettingzoo.classic.rps_v2")  # needs pygame, imported by the env module
    env = rps_v2.parallel_env(max_cycles=15)
    assert is_multi_agent_env(env)
    check_multi_agent_env(env, num_steps=40)
    assert multi_agent_env_spaces(env)["player_0"] == (spaces.Discrete(4), spaces.Discrete(3))

    aec = rps_v2.env(max_cycles=5)  # the AEC version is wrapped, one player moving per step
    assert not is_multi_agent_env(aec)
    check_multi_agent_env(aec, num_steps=40)
    wrapped = make_env(lambda cfg: rps_v2.env(max_cycles=5))
    assert isinstance(wrapped, TurnBasedEnv) and is_multi_agent_env(wrapped)
    check_multi_agent_env(wrapped, num_steps=40)
