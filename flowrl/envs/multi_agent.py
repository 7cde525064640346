"""The multi-agent env API: PettingZoo's Parallel API, which flowrl's multi-agent envs follow.

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

A *turn-based* env (class attribute ``turn_based = True``) follows the same API with one agent moving
per step: ``agents`` holds every agent still in the game and each step's dicts are keyed by them
(every agent observes every step), but only ``agent_selection``'s action is used; the others may be
left out of ``actions`` and are ignored (:func:`acting_agents` says who acts).
:class:`~flowrl.envs.turn_based.TurnBasedEnv` presents PettingZoo's turn-based AEC envs this way.

:class:`MultiAgentEnv` is an optional base class for that API; :func:`is_multi_agent_env` recognises
any env that follows it (subclass or not). :mod:`flowrl.envs.multi_agent_checker` checks one strictly,
and :mod:`flowrl.envs.multi_agent_envs` holds flowrl's built-in multi-agent envs.
"""

from __future__ import annotations

import abc
from collections.abc import Hashable
from typing import Any, ClassVar, Generic, TypeVar

import gymnasium
from gymnasium import spaces

AgentID = Hashable
"""Any agent id, of any env."""

AgentIDT = TypeVar("AgentIDT", bound=Hashable)
"""The agent-id type of one env (``int``, ``str``, ...): :class:`MultiAgentEnv` is generic in it."""


class MultiAgentEnv(abc.ABC, Generic[AgentIDT]):
    """Base class for a multi-agent env with PettingZoo's Parallel API (see the module docstring).

    Subclasses set ``possible_agents`` in ``__init__`` and ``agents`` in ``reset`` (and shrink it
    in ``step``), and implement the four abstract methods. Subclassing is optional: flowrl accepts
    any object with this API, PettingZoo ``ParallelEnv`` s included. Like PettingZoo's
    ``ParallelEnv``, the class is generic in its agent-id type: an env whose agents are ``0 .. n-1``
    subclasses ``MultiAgentEnv[int]`` and takes ``agent: int`` in its space methods.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    possible_agents: list[AgentIDT]
    agents: list[AgentIDT]

    @abc.abstractmethod
    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Start an episode; return ``(obs, infos)``, dicts keyed by the live agents (``self.agents``)."""

    @abc.abstractmethod
    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        """Apply one action per live agent; return ``(obs, rewards, terminations, truncations, infos)``."""

    @abc.abstractmethod
    def observation_space(self, agent: AgentIDT) -> spaces.Space:
        """``agent``'s observation space (the same object on every call)."""

    @abc.abstractmethod
    def action_space(self, agent: AgentIDT) -> spaces.Space:
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
    def unwrapped(self) -> MultiAgentEnv[AgentIDT]:
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


def aec_env_message(env: Any, problem: str) -> str:
    """Why a PettingZoo AEC (turn-based) env cannot be wrapped in :class:`~flowrl.envs.turn_based.TurnBasedEnv`
    (``problem``: what its API lacks), and what works instead."""
    return (
        f"{type(env).__name__} is a PettingZoo AEC (turn-based) env that flowrl.envs.TurnBasedEnv cannot wrap: "
        f"{problem}; it needs PettingZoo's AEC API (possible_agents, agents, agent_selection, "
        f"observation_space(agent), action_space(agent), observe(agent), last(), reset(seed=None, options=None), "
        f"step(action), and step(None) removing a finished agent), or give a Parallel env instead (for a "
        f"simultaneous-move game, its parallel_env(); PettingZoo's aec_to_parallel converts only envs whose "
        f"metadata says is_parallelizable, and turn_based_aec_to_parallel leaves every agent acting on every step)"
    )


def is_turn_based(env: Any) -> bool:
    """Whether ``env`` is a turn-based Parallel-API env (``turn_based = True``): only ``agent_selection`` acts."""
    return getattr(env, "turn_based", False) is True


def acting_agents(env: Any) -> list[AgentID]:
    """The agents whose actions ``env``'s next ``step`` uses: ``env.agents``, or for a turn-based env the
    one agent whose turn it is (``env.agent_selection``; none once the episode is over)."""
    if not is_turn_based(env):
        return list(env.agents)
    mover = env.agent_selection
    return [mover] if env.agents and mover in env.agents else []


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
