"""flowrl's built-in multi-agent envs, available by name (see :mod:`flowrl.envs.registry`).

The two envs defined here follow the Parallel API of :mod:`flowrl.envs.multi_agent` and validate
their ``env_config``: an unknown key or a value that is not an int >= 1 raises :class:`EnvError`.
The built-in names also give ``TicTacToe``, PettingZoo's tic-tac-toe as a turn-based env (see
:mod:`flowrl.envs.turn_based`).
"""

from __future__ import annotations

from typing import Any, ClassVar, NoReturn

import gymnasium
import numpy as np
from gymnasium import spaces

from flowrl.envs.checker import abbreviate
from flowrl.envs.multi_agent import AgentID, MultiAgentEnv
from flowrl.envs.turn_based import TicTacToe
from flowrl.errors import EnvError


def _validated_config(env_name: str, env_config: dict | None, defaults: dict[str, int]) -> dict[str, int]:
    config = dict(env_config or {})
    unknown = sorted(set(config) - set(defaults))
    if unknown:
        raise EnvError(f"{env_name} got unknown env_config keys {unknown}; valid keys are {sorted(defaults)}")
    values = {**defaults, **config}
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise EnvError(
                f"{env_name} env_config[{key!r}]={value!r}; it must be an int >= 1 (default {defaults[key]})"
            )
    return {key: int(value) for key, value in values.items()}


class MultiAgentCartPole(MultiAgentEnv[int]):
    """``num_agents`` independent CartPole-v1 copies, agent ids ``0 .. num_agents - 1``.

    ``env_config``: ``{"num_agents": 4}`` (the default). Agent ``i`` leaves ``agents`` when its
    own pole falls (termination) or its own 500-step limit is reached (truncation); the episode
    ends when every agent has left. ``reset(seed=s)`` seeds agent ``i``'s CartPole with ``s + i``.
    Each agent gets CartPole's reward, 1.0 per step it is live.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, env_config: dict | None = None) -> None:
        config = _validated_config(type(self).__name__, env_config, {"num_agents": 4})
        self._envs = [gymnasium.make("CartPole-v1") for _ in range(config["num_agents"])]
        self.possible_agents: list[int] = list(range(config["num_agents"]))
        self.agents: list[int] = []
        self._observation_spaces = {agent: env.observation_space for agent, env in enumerate(self._envs)}
        self._action_spaces = {agent: env.action_space for agent, env in enumerate(self._envs)}

    def observation_space(self, agent: int) -> spaces.Space:
        return _lookup(self._observation_spaces, agent, "observation_space", self.possible_agents)

    def action_space(self, agent: int) -> spaces.Space:
        return _lookup(self._action_spaces, agent, "action_space", self.possible_agents)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        obs, infos = {}, {}
        for agent, env in enumerate(self._envs):
            obs[agent], infos[agent] = env.reset(seed=None if seed is None else seed + agent, options=options)
        self.agents = list(self.possible_agents)
        return obs, infos

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        agents = self.agents
        if not agents or not isinstance(actions, dict) or len(actions) != len(agents):
            _raise_bad_actions(actions, agents)
        obs, rewards, terminations, truncations, infos = {}, {}, {}, {}, {}
        still_live = []
        envs = self._envs
        for agent in agents:
            try:
                action = actions[agent]
            except KeyError:
                _raise_bad_actions(actions, agents)
            obs[agent], rewards[agent], terminated, truncated, infos[agent] = envs[agent].step(action)
            terminations[agent] = terminated
            truncations[agent] = truncated
            if not (terminated or truncated):
                still_live.append(agent)
        self.agents = still_live
        return obs, rewards, terminations, truncations, infos

    def close(self) -> None:
        for env in self._envs:
            env.close()


class CooperativeMatching(MultiAgentEnv[str]):
    """A two-agent cooperative game: both agents are rewarded for naming the cue they are shown.

    Agents ``"agent_0"`` and ``"agent_1"``. Every step one cue is drawn uniformly from
    ``0 .. num_cues - 1`` and shown to both agents as a one-hot float32 vector
    (``Box(0, 1, (num_cues,))``); each agent answers with ``Discrete(num_cues)``. Both agents get
    the same (shared) reward: the fraction of the two that named the current cue (0, 0.5 or 1).
    Every episode lasts exactly ``episode_length`` steps, after which both agents terminate, so
    the best return is ``episode_length`` and random play earns ``episode_length / num_cues`` on
    average. The cues are drawn from the RNG seeded by ``reset(seed=...)``, so an episode is
    determined by its seed. ``env_config``: ``{"num_cues": 3, "episode_length": 10}`` (defaults).
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, env_config: dict | None = None) -> None:
        config = _validated_config(type(self).__name__, env_config, {"num_cues": 3, "episode_length": 10})
        self.num_cues = config["num_cues"]
        self.episode_length = config["episode_length"]
        self.possible_agents: list[str] = ["agent_0", "agent_1"]
        self.agents: list[str] = []
        observation_space = spaces.Box(0.0, 1.0, (self.num_cues,), np.float32)
        self._observation_spaces = {agent: observation_space for agent in self.possible_agents}
        self._action_spaces = {agent: spaces.Discrete(self.num_cues) for agent in self.possible_agents}
        self._rng = np.random.default_rng()
        self._cue = 0
        self._t = 0

    def observation_space(self, agent: str) -> spaces.Space:
        return _lookup(self._observation_spaces, agent, "observation_space", self.possible_agents)

    def action_space(self, agent: str) -> spaces.Space:
        return _lookup(self._action_spaces, agent, "action_space", self.possible_agents)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._t = 0
        self.agents = list(self.possible_agents)
        return self._observe(), {agent: {} for agent in self.agents}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        agents = self.agents
        if (
            not agents
            or not isinstance(actions, dict)
            or len(actions) != len(agents)
            or any(agent not in actions for agent in agents)
        ):
            _raise_bad_actions(actions, agents)
        matched = sum(int(actions[agent]) == self._cue for agent in agents)
        reward = matched / len(agents)
        self._t += 1
        done = self._t >= self.episode_length
        obs = self._observe()
        rewards = {agent: reward for agent in agents}
        terminations = {agent: done for agent in agents}
        truncations = {agent: False for agent in agents}
        infos: dict[str, dict[str, Any]] = {agent: {} for agent in agents}
        if done:
            self.agents = []
        return obs, rewards, terminations, truncations, infos

    def _observe(self) -> dict:
        self._cue = int(self._rng.integers(self.num_cues))
        one_hot = np.zeros(self.num_cues, dtype=np.float32)
        one_hot[self._cue] = 1.0
        return {agent: one_hot.copy() for agent in self.agents}


def _lookup(spaces_by_agent: dict, agent: AgentID, method: str, possible_agents: list) -> spaces.Space:
    try:
        return spaces_by_agent[agent]
    except (KeyError, TypeError):
        raise EnvError(f"{method}({agent!r}): unknown agent; the agents are {possible_agents}") from None


def _raise_bad_actions(actions: Any, agents: list) -> NoReturn:
    if not isinstance(actions, dict):
        raise EnvError(
            f"step() needs a dict of actions keyed by agent; got {abbreviate(actions)} of type {type(actions).__name__}"
        )
    if not agents:
        raise EnvError("step() called with no live agents: the episode is over (env.agents is empty); call reset()")
    missing = [agent for agent in agents if agent not in actions]
    if missing:
        raise EnvError(
            f"step() got no action for live agent {missing[0]!r}; actions are needed for env.agents {agents}"
        )
    extra = [agent for agent in actions if agent not in set(agents)]
    raise EnvError(
        f"step() got an action for agent {extra[0]!r}, which is not live; "
        f"actions are needed only for env.agents {agents}"
    )


# The names the registry resolves before Gymnasium ids; a class is its own picklable creator.
BUILTIN_MULTI_AGENT_ENVS: dict[str, type[MultiAgentEnv[Any]]] = {
    "MultiAgentCartPole": MultiAgentCartPole,
    "CooperativeMatching": CooperativeMatching,
    "TicTacToe": TicTacToe,
}
