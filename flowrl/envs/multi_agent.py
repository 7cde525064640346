"""The multi-agent env API (PettingZoo's Parallel API), its checker and flowrl's built-in multi-agent envs.

A multi-agent env steps every live agent at once. Its contract, the same as PettingZoo's
``ParallelEnv`` so that PettingZoo envs work unchanged:

- ``possible_agents``: every agent id the env can ever have (hashable ids, e.g. ints or strings);
- ``agents``: the agents live now (set by ``reset``, shrinking as agents finish);
- ``observation_space(agent)`` / ``action_space(agent)``: that agent's gymnasium spaces, the same
  object on every call (seeding an action space must stick);
- ``reset(seed=None, options=None) -> (obs, infos)``: dicts keyed by the live agents;
- ``step(actions) -> (obs, rewards, terminations, truncations, infos)``: ``actions`` holds one
  action per live agent; each returned dict is keyed by the agents that acted (plus any agent that
  joined during the step). An agent whose termination or truncation is True is removed from
  ``agents`` by that step, and the episode is over when ``agents`` is empty;
- ``close()``.

:class:`MultiAgentEnv` is an optional base class for that API; :func:`is_multi_agent_env` recognises
any env that follows it (subclass or not); :func:`check_multi_agent_env` checks one strictly.
"""

from __future__ import annotations

import abc
from collections.abc import Hashable
from typing import Any, ClassVar, NoReturn

import gymnasium
import numpy as np
from gymnasium import spaces

from flowrl.envs.checker import (
    _check_obs,
    _check_reset_accepts_seed,
    _check_reward,
    _check_step_arity,
    _checked_flag,
    _same,
    _short,
)
from flowrl.errors import EnvCheckError, EnvError

AgentID = Hashable

_PARALLEL_API = "reset(seed=None, options=None) -> (obs, infos)"
_STEP_API = "(obs, rewards, terminations, truncations, infos)"
_STEP_FIELDS = ("obs", "rewards", "terminations", "truncations", "infos")


class MultiAgentEnv(abc.ABC):
    """Base class for a multi-agent env with PettingZoo's Parallel API (see the module docstring).

    Subclasses set ``possible_agents`` in ``__init__`` and ``agents`` in ``reset`` (and shrink it
    in ``step``), and implement the four abstract methods. Subclassing is optional: flowrl accepts
    any object with this API, PettingZoo ``ParallelEnv`` s included.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    possible_agents: list[AgentID]
    agents: list[AgentID]

    @abc.abstractmethod
    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Start an episode; return ``(obs, infos)``, dicts keyed by the live agents (``self.agents``)."""

    @abc.abstractmethod
    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        """Apply one action per live agent; return ``(obs, rewards, terminations, truncations, infos)``."""

    @abc.abstractmethod
    def observation_space(self, agent: AgentID) -> spaces.Space:
        """``agent``'s observation space (the same object on every call)."""

    @abc.abstractmethod
    def action_space(self, agent: AgentID) -> spaces.Space:
        """``agent``'s action space (the same object on every call, so that seeding it sticks)."""

    def close(self) -> None:
        """Release the env's resources; the default holds none."""

    @property
    def num_agents(self) -> int:
        """How many agents are live now."""
        return len(self.agents)

    @property
    def max_num_agents(self) -> int:
        """How many agents the env can have."""
        return len(self.possible_agents)

    @property
    def unwrapped(self) -> MultiAgentEnv:
        return self


def is_multi_agent_env(env: Any) -> bool:
    """Whether ``env`` follows the Parallel API: ``possible_agents``, callable spaces, ``reset`` and ``step``.

    Duck-typed, so PettingZoo ``ParallelEnv`` s count; a ``gymnasium.Env`` and a PettingZoo AEC
    (turn-based) env do not.
    """
    if isinstance(env, (gymnasium.Env, type)) or _is_aec_env(env):
        return False
    return hasattr(env, "possible_agents") and all(
        callable(getattr(env, method, None)) for method in ("observation_space", "action_space", "reset", "step")
    )


def _is_aec_env(env: Any) -> bool:
    # PettingZoo's turn-based envs (and their wrappers) have last() and agent_iter(); parallel ones don't.
    return callable(getattr(env, "last", None)) and callable(getattr(env, "agent_iter", None))


def aec_env_message(env: Any) -> str:
    """Why a PettingZoo AEC env is refused, and how to convert it."""
    return (
        f"{type(env).__name__} is a PettingZoo AEC (turn-based) env; flowrl needs the Parallel API "
        f"(use the env's parallel_env() constructor, or pettingzoo.utils.conversions.aec_to_parallel(env))"
    )


def multi_agent_spaces(env: Any) -> dict[AgentID, tuple[spaces.Space, spaces.Space]]:
    """``{agent: (observation_space, action_space)}`` for every possible agent of a multi-agent env."""
    return {agent: (env.observation_space(agent), env.action_space(agent)) for agent in env.possible_agents}


def seed_action_spaces(env: Any, seed: int) -> None:
    """Seed the action space of the ``i``-th possible agent with ``seed + i``, so sampled actions repeat.

    Agents that share one space object seed it once (with the first such agent's seed).
    """
    seeded: set[int] = set()
    for index, agent in enumerate(env.possible_agents):
        space = env.action_space(agent)
        if id(space) not in seeded:
            space.seed(seed + index)
            seeded.add(id(space))


# ---------------------------------------------------------------------------------------------
# The checker


def check_multi_agent_env(env: Any, *, num_steps: int = 50, seed: int = 0) -> None:
    """Check a Parallel-API env's agents, spaces, ``reset`` and ``num_steps`` random ``step`` calls.

    The multi-agent counterpart of :func:`flowrl.envs.check_env`: resets twice with ``seed`` (the
    first observations must match), then steps with actions sampled from each live agent's action
    space (seeded from ``seed``), resetting when ``agents`` becomes empty. The env is left open.
    Raises :class:`EnvCheckError` on the first problem, naming the method, agent, field and bound.
    """
    if isinstance(env, gymnasium.Env):
        raise EnvCheckError(
            f"env is a gymnasium.Env ({type(env).__name__}), a single-agent env; check it with flowrl.envs.check_env"
        )
    if _is_aec_env(env):
        raise EnvCheckError(aec_env_message(env))
    possible_agents = _checked_possible_agents(env)
    observation_spaces = {agent: _agent_space(env, "observation_space", agent) for agent in possible_agents}
    action_spaces = {agent: _agent_space(env, "action_space", agent) for agent in possible_agents}
    for method in ("reset", "step"):
        if not callable(getattr(env, method, None)):
            raise EnvCheckError(f"env has no {method}() method; the Parallel API needs reset() and step()")
    _check_reset_accepts_seed(env, api=f"PettingZoo's Parallel API is {_PARALLEL_API}")

    first_obs, first_agents = _checked_reset(env, observation_spaces, seed)
    again_obs, again_agents = _checked_reset(env, observation_spaces, seed)
    if first_agents != again_agents or not _same(first_obs, again_obs):
        raise EnvCheckError(
            f"env.reset(seed={seed}) ignores seed: two calls returned different first observations "
            f"{_short(first_obs)} and {_short(again_obs)} (agents {first_agents} and {again_agents}); "
            f"reset must seed every source of randomness in the env"
        )

    seed_action_spaces(env, seed)

    obs = first_obs
    finished: set = set()
    for step in range(1, num_steps + 1):
        where = f" (step {step} of check_multi_agent_env)"
        live = list(env.agents)
        actions = {agent: _sample_action(action_spaces[agent], obs.get(agent)) for agent in live}
        try:
            result = env.step(actions)
        except Exception as exc:
            raise EnvCheckError(f"env.step({_short(actions)}) raised {type(exc).__name__}: {exc}{where}") from exc
        obs, done = _check_step_result(env, result, live, possible_agents, observation_spaces, finished, where)
        finished |= done
        if not env.agents:
            obs, _ = _checked_reset(env, observation_spaces, None)
            finished = set()


def _checked_possible_agents(env: Any) -> list:
    if not hasattr(env, "possible_agents"):
        raise EnvCheckError("env has no possible_agents; it must list every agent id the env can have, set in __init__")
    possible = env.possible_agents
    if not isinstance(possible, (list, tuple)) or not possible:
        raise EnvCheckError(
            f"env.possible_agents is {_short(possible)} of type {type(possible).__name__}; "
            f"it must be a non-empty list of agent ids"
        )
    for agent in possible:
        try:
            hash(agent)
        except TypeError:
            raise EnvCheckError(
                f"env.possible_agents holds {_short(agent)} of type {type(agent).__name__}, which is not hashable; "
                f"agent ids key dicts (use ints or strings)"
            ) from None
    if len(set(possible)) != len(possible):
        repeated = sorted({repr(a) for a in possible if list(possible).count(a) > 1})
        raise EnvCheckError(f"env.possible_agents repeats the agent ids {', '.join(repeated)}; ids must be unique")
    return list(possible)


def _agent_space(env: Any, method: str, agent: AgentID) -> spaces.Space:
    call = f"env.{method}({agent!r})"
    if not callable(getattr(env, method, None)):
        raise EnvCheckError(
            f"env.{method} is not a method; the Parallel API has {method}(agent) -> gymnasium.spaces.Space"
        )
    try:
        space = getattr(env, method)(agent)
        again = getattr(env, method)(agent)
    except Exception as exc:
        raise EnvCheckError(
            f"{call} raised {type(exc).__name__}: {exc} (agent {agent!r} is in possible_agents)"
        ) from exc
    if not isinstance(space, spaces.Space):
        raise EnvCheckError(
            f"{call} returned {_short(space)} of type {type(space).__name__}, "
            f"but it must be a gymnasium.spaces.Space (e.g. gymnasium.spaces.Box)"
        )
    if again != space:
        raise EnvCheckError(f"{call} returned {_short(space)} and then {_short(again)}; an agent's space must not change")
    return space


def _checked_reset(env: Any, observation_spaces: dict, seed: int | None) -> tuple[dict, list]:
    method, kwargs = (f"env.reset(seed={seed})", {"seed": seed}) if seed is not None else ("env.reset()", {})
    try:
        result = env.reset(**kwargs)
    except Exception as exc:
        raise EnvCheckError(f"{method} raised {type(exc).__name__}: {exc}") from exc
    if not (isinstance(result, tuple) and len(result) == 2):
        raise EnvCheckError(
            f"{method} returned {_short(result)} of type {type(result).__name__}; "
            f"the Parallel API's reset returns the pair (obs, infos) of dicts keyed by agent"
        )
    obs, infos = result
    for field, value in (("obs", obs), ("infos", infos)):
        if not isinstance(value, dict):
            raise EnvCheckError(
                f"{method} returned {field} {_short(value)} of type {type(value).__name__}; "
                f"{field} must be a dict keyed by agent"
            )
    agents = _checked_agents(env, method, set(observation_spaces), "")
    if not agents:
        raise EnvCheckError(f"{method} left env.agents empty; reset must set env.agents to the live agents")
    _check_keys(method, "obs", obs, agents, "")
    _check_info_keys(method, infos, agents, "")
    for agent in agents:
        _check_agent_obs(obs[agent], agent, observation_spaces[agent], method, "")
    return obs, agents


def _checked_agents(env: Any, method: str, possible: set, where: str) -> list:
    agents = getattr(env, "agents", None)
    if not isinstance(agents, (list, tuple)):
        raise EnvCheckError(
            f"after {method}, env.agents is {_short(agents)} of type {type(agents).__name__}; "
            f"it must be the list of live agent ids{where}"
        )
    strangers = [agent for agent in agents if agent not in possible]
    if strangers:
        raise EnvCheckError(
            f"after {method}, env.agents holds {_short(strangers)}, not in env.possible_agents "
            f"{_short(sorted(possible, key=repr))}{where}"
        )
    if len(set(agents)) != len(agents):
        raise EnvCheckError(f"after {method}, env.agents {_short(list(agents))} repeats an agent{where}")
    return list(agents)


def _keyed_by(method: str, expected: list) -> str:
    who = "the live agents (env.agents)" if method.startswith("env.reset") else "the agents that acted"
    return f"{who}, {_short(expected)}"


def _check_keys(method: str, field: str, value: dict, expected: list, where: str) -> None:
    missing = [agent for agent in expected if agent not in value]
    if missing:
        raise EnvCheckError(
            f"{method} returned {field} without agent {missing[0]!r}; {field} must be keyed by "
            f"{_keyed_by(method, expected)}{where}"
        )
    if len(value) != len(expected):
        extra = [key for key in value if key not in set(expected)]
        raise EnvCheckError(
            f"{method} returned {field} for agent {extra[0]!r}, which is not live; {field} must be keyed by "
            f"{_keyed_by(method, expected)}{where}"
        )


def _check_info_keys(method: str, infos: dict, expected: list, where: str) -> None:
    # An agent may have no info entry (an empty info is often left out), but no entry for a stranger.
    allowed = set(expected)
    for agent, info in infos.items():
        if agent not in allowed:
            raise EnvCheckError(
                f"{method} returned infos for agent {agent!r}, which is not live; infos must be keyed by "
                f"{_keyed_by(method, expected)}{where}"
            )
        if not isinstance(info, dict):
            raise EnvCheckError(
                f"{method} returned infos[{agent!r}]={_short(info)} of type {type(info).__name__}; "
                f"each agent's info must be a dict{where}"
            )


def _check_agent_obs(obs: Any, agent: AgentID, space: spaces.Space, method: str, where: str) -> None:
    _check_obs(obs, space, method, f"obs[{agent!r}]", f"observation_space({agent!r})", f" for agent {agent!r}{where}")


def _check_step_result(
    env: Any,
    result: Any,
    live: list,
    possible_agents: list,
    observation_spaces: dict,
    finished: set,
    where: str,
) -> tuple[dict, set]:
    """Check one step's return and the agents' bookkeeping; return the obs and the agents that finished."""
    method = "env.step()"
    _check_step_arity(
        result, method, f"the Parallel API's 5-tuple of dicts {_STEP_API}", "(obs, rewards, dones, infos), the old API", where
    )
    for field, value in zip(_STEP_FIELDS, result):
        if not isinstance(value, dict):
            raise EnvCheckError(
                f"{method} returned {field} {_short(value)} of type {type(value).__name__}; "
                f"{field} must be a dict keyed by agent{where}"
            )
    obs, rewards, terminations, truncations, infos = result

    agents_after = _checked_agents(env, method, set(possible_agents), where)
    revived = [agent for agent in agents_after if agent in finished]
    if revived:
        raise EnvCheckError(
            f"after {method}, env.agents holds agent {revived[0]!r}, which finished earlier in the episode; "
            f"a finished agent cannot come back before reset(){where}"
        )
    live_set = set(live)
    acted = live + [agent for agent in agents_after if agent not in live_set]  # joined during the step
    for field, value in zip(_STEP_FIELDS[:4], result[:4]):
        _check_keys(method, field, value, acted, where)
    _check_info_keys(method, infos, acted, where)

    after = set(agents_after)
    done: set = set()
    for agent in acted:
        _check_agent_obs(obs[agent], agent, observation_spaces[agent], method, where)
        _check_reward(rewards[agent], method, f"rewards[{agent!r}]", "each reward", where)
        flags = [
            _checked_flag(value[agent], method, f"{field}[{agent!r}]", f"each entry of {field}", where)
            for field, value in (("terminations", terminations), ("truncations", truncations))
        ]
        if any(flags) and agent in after:
            field = "terminations" if flags[0] else "truncations"
            raise EnvCheckError(
                f"after {method} returned {field}[{agent!r}]=True, agent {agent!r} is still in env.agents "
                f"{_short(agents_after)}; step must remove a finished agent from env.agents{where}"
            )
        if not any(flags) and agent not in after:
            raise EnvCheckError(
                f"after {method}, agent {agent!r} left env.agents although terminations[{agent!r}] and "
                f"truncations[{agent!r}] are False; an agent leaves only by terminating or truncating{where}"
            )
        if any(flags):
            done.add(agent)
    return obs, done


def _sample_action(space: spaces.Space, agent_obs: Any) -> Any:
    # Respect an action mask when the observation carries one (PettingZoo's convention for legal moves).
    if isinstance(agent_obs, dict) and "action_mask" in agent_obs and isinstance(space, spaces.Discrete):
        mask = np.asarray(agent_obs["action_mask"], dtype=np.int8)
        if mask.any():
            return space.sample(mask=mask)
    return space.sample()


# ---------------------------------------------------------------------------------------------
# Built-in multi-agent envs


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


class MultiAgentCartPole(MultiAgentEnv):
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


class CooperativeMatching(MultiAgentEnv):
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
        infos = {agent: {} for agent in agents}
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
            f"step() needs a dict of actions keyed by agent; got {_short(actions)} of type {type(actions).__name__}"
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
        f"step() got an action for agent {extra[0]!r}, which is not live; actions are needed only for env.agents {agents}"
    )


BUILTIN_MULTI_AGENT_ENVS: dict[str, type[MultiAgentEnv]] = {
    "MultiAgentCartPole": MultiAgentCartPole,
    "CooperativeMatching": CooperativeMatching,
}
