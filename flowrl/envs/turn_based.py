"""PettingZoo's turn-based (AEC) envs with flowrl's multi-agent API: one agent moves per step.

:class:`TurnBasedEnv` wraps an AEC env (board and card games: tic-tac-toe, Connect Four, chess, ...)
and presents PettingZoo's Parallel API as a *turn-based* env (``turn_based = True``, see
:mod:`flowrl.envs.multi_agent`):

- ``agents`` is every agent still in the game, and every dict of ``reset`` and ``step`` is keyed by
  them: each agent observes the game after every move;
- ``agent_selection`` is the agent whose turn it is; ``step(actions)`` uses only its action (the
  others may be left out, and are ignored), so a sampler acts for that one agent only;
- an agent's reward is what PettingZoo's ``last()`` gives it when its turn comes again: everything it
  earned since it last moved, its opponents' moves included. The others get 0 in that step;
- when the game ends, every agent gets its final observation, its final reward and its termination or
  truncation in the same step (the wrapper plays PettingZoo's ``step(None)`` for each finished agent),
  so that each agent's trajectory ends on that step with the reward of its last move.

A PettingZoo observation ``{"observation": ..., "action_mask": ...}`` is presented as flowrl's masked
observation ``{"observations": ..., "action_mask": ...}`` (see :mod:`flowrl.envs.flatten`), so the
legal moves reach the policies. flowrl wraps AEC envs wherever it creates one (creators, registered
names, ``flowrl train --env``); ``TicTacToe`` is PettingZoo's tic-tac-toe so wrapped, a built-in name.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces

from flowrl.envs.checker import abbreviate
from flowrl.envs.flatten import ACTION_MASK_KEY, OBSERVATIONS_KEY, action_mask_of
from flowrl.envs.multi_agent import AgentID, MultiAgentEnv, _is_aec_env, aec_env_message
from flowrl.errors import EnvError, install_hint

#: The key of the part a PettingZoo classic game's observation shows (flowrl's is ``"observations"``).
PETTINGZOO_OBSERVATION_KEY = "observation"
#: The AEC members the wrapper calls.
_AEC_METHODS = ("reset", "step", "last", "observe", "observation_space", "action_space")


class TurnBasedEnv(MultiAgentEnv[Any]):
    """A PettingZoo AEC env with the turn-based Parallel API (see the module): one agent moves per step.

    ``env`` is the AEC env (a PettingZoo ``AECEnv`` or anything with its API); raises
    :class:`~flowrl.errors.EnvError` naming what is missing when it lacks that API. ``illegal_actions``
    counts the moves given against the mover's action mask (the game decides what such a move does).
    """

    turn_based: ClassVar[bool] = True

    def __init__(self, env: Any) -> None:
        missing = [name for name in _AEC_METHODS if not callable(getattr(env, name, None))]
        if missing:
            raise EnvError(aec_env_message(env, f"it has no method {', '.join(missing)}"))
        possible = getattr(env, "possible_agents", None)
        if not isinstance(possible, (list, tuple)) or not possible:
            raise EnvError(aec_env_message(env, f"its possible_agents is {abbreviate(possible)}, not a list of agents"))
        self.aec = env
        self.possible_agents: list[Any] = list(possible)
        self.agents: list[Any] = []
        #: The agent whose turn it is (None before ``reset`` and once the game is over).
        self.agent_selection: Any = None
        #: Moves given against the mover's action mask.
        self.illegal_actions = 0
        self._observation_spaces: dict[AgentID, spaces.Space[Any]] = {}
        self._renamed: dict[AgentID, bool] = {}
        self._obs: dict[AgentID, Any] = {}
        self._infos: dict[AgentID, dict[str, Any]] = {}

    def observation_space(self, agent: AgentID) -> spaces.Space[Any]:
        """The AEC env's space for ``agent``, a ``{"observation", "action_mask"}`` Dict renamed to flowrl's keys."""
        space = self._observation_spaces.get(agent)
        if space is None:
            space = self.aec.observation_space(agent)
            renamed = (
                isinstance(space, spaces.Dict)
                and PETTINGZOO_OBSERVATION_KEY in space.spaces
                and ACTION_MASK_KEY in space.spaces
                and OBSERVATIONS_KEY not in space.spaces
            )
            if renamed:
                space = spaces.Dict({_renamed_key(key): part for key, part in space.spaces.items()})
            self._renamed[agent] = renamed
            self._observation_spaces[agent] = space
        return space

    def action_space(self, agent: AgentID) -> spaces.Space[Any]:
        """The AEC env's action space for ``agent`` (the same object on every call)."""
        space: spaces.Space[Any] = self.aec.action_space(agent)
        return space

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Reset the AEC env; return every agent's observation and info (``agent_selection`` moves first)."""
        self.aec.reset(seed=seed, options=options)
        self._follow_aec()
        obs = {agent: self._observation(agent, self.aec.observe(agent)) for agent in self.agents}
        infos = {agent: self._info(agent) for agent in self.agents}
        self._obs, self._infos = obs, infos
        return obs, infos

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        """Play ``actions[agent_selection]``; the others' actions are ignored. Returns the five dicts keyed by
        the agents in the game before the move (and any that joined): see the module for what each holds."""
        mover = self._checked_mover(actions)
        action = actions[mover]
        self._count_illegal(mover, action)
        before = list(self.agents)
        self.aec.step(action)
        rewards = dict.fromkeys(before, 0.0)
        terminations = dict.fromkeys(before, False)
        truncations = dict.fromkeys(before, False)
        obs: dict[AgentID, Any] = {}
        infos: dict[AgentID, dict[str, Any]] = {}
        # PettingZoo selects each finished agent in turn: last() gives its final observation and reward,
        # and step(None) removes it. The first agent not finished is the next to move, and last() gives
        # it what it earned since its own last move.
        while self.aec.agents:
            agent = self.aec.agent_selection
            agent_obs, reward, terminated, truncated, info = self.aec.last()
            rewards[agent] = rewards.get(agent, 0.0) + float(reward)
            if not (terminated or truncated):
                break
            terminations[agent], truncations[agent] = bool(terminated), bool(truncated)
            obs[agent] = self._observation(agent, agent_obs)
            infos[agent] = dict(info or {})
            self.aec.step(None)
            if agent in self.aec.agents:
                raise EnvError(
                    aec_env_message(self.aec, f"step(None) for the finished agent {agent!r} left it in agents")
                )
        self._follow_aec()
        for agent in self.agents:
            obs[agent] = self._observation(agent, self.aec.observe(agent))
            infos[agent] = self._info(agent)
            # An agent that joined with this move.
            rewards.setdefault(agent, 0.0)
            terminations.setdefault(agent, False)
            truncations.setdefault(agent, False)
        self._obs, self._infos = obs, infos
        return obs, rewards, terminations, truncations, infos

    def close(self) -> None:
        """Close the AEC env."""
        self.aec.close()

    def render(self) -> Any:
        """The AEC env's ``render()``."""
        return self.aec.render()

    def _follow_aec(self) -> None:
        self.agents = list(self.aec.agents)
        self.agent_selection = self.aec.agent_selection if self.agents else None

    def _checked_mover(self, actions: Any) -> AgentID:
        if not self.agents:
            raise EnvError("step() called with no agents in the game: the episode is over; call reset()")
        if not isinstance(actions, Mapping):
            raise EnvError(
                f"step() needs a dict of actions keyed by agent; got {abbreviate(actions)} "
                f"of type {type(actions).__name__}"
            )
        mover = self.agent_selection
        if mover not in actions:
            raise EnvError(
                f"step() got no action for {mover!r}, whose turn it is (agent_selection); "
                f"the actions given were for {abbreviate(list(actions))}"
            )
        strangers = [agent for agent in actions if agent not in self.agents]
        if strangers:
            raise EnvError(
                f"step() got an action for {strangers[0]!r}, which is not in the game; the agents are {self.agents}"
            )
        return mover

    def _count_illegal(self, mover: AgentID, action: Any) -> None:
        mask = action_mask_of(self._obs.get(mover), self._infos.get(mover))
        if mask is None:
            return
        try:
            legal = bool(np.asarray(mask)[int(action)])
        except (TypeError, ValueError, IndexError):
            legal = False
        if not legal:
            self.illegal_actions += 1

    def _observation(self, agent: AgentID, obs: Any) -> Any:
        self.observation_space(agent)  # decides whether the agent's observations are renamed
        if self._renamed[agent] and isinstance(obs, Mapping):
            return {_renamed_key(key): part for key, part in obs.items()}
        return obs

    def _info(self, agent: AgentID) -> dict[str, Any]:
        info = getattr(self.aec, "infos", {}).get(agent)
        return dict(info) if isinstance(info, Mapping) else {}


def _renamed_key(key: str) -> str:
    return OBSERVATIONS_KEY if key == PETTINGZOO_OBSERVATION_KEY else key


def wrap_turn_based(env: Any) -> Any:
    """``env`` in a :class:`TurnBasedEnv` if it is a PettingZoo AEC env (not wrapped yet), else ``env`` unchanged."""
    return TurnBasedEnv(env) if _is_aec_env(env) else env


class TicTacToe(TurnBasedEnv):
    """PettingZoo's classic tic-tac-toe (``tictactoe_v3``) as a turn-based env: a built-in name.

    Agents ``"player_1"`` (X, moves first) and ``"player_2"``; observations ``{"observations": Box(0, 1,
    (3, 3, 2), int8), "action_mask": 9 int8 0/1}``, the first plane the mover's own marks; actions
    ``Discrete(9)``; +1 for a win, -1 for a loss (and for an illegal move, which ends the game), 0 for a
    draw. ``env_config`` is passed to ``tictactoe_v3.env`` (e.g. ``{"render_mode": "rgb_array"}``). Needs
    the ``pettingzoo`` extra.
    """

    #: The ``env_config`` keys ``tictactoe_v3.env`` takes.
    CONFIG_KEYS: ClassVar[tuple[str, ...]] = ("render_mode", "screen_height")

    def __init__(self, env_config: dict | None = None) -> None:
        config = dict(env_config or {})
        unknown = sorted(set(config) - set(self.CONFIG_KEYS))
        if unknown:
            raise EnvError(f"TicTacToe got unknown env_config keys {unknown}; valid keys are {list(self.CONFIG_KEYS)}")
        super().__init__(_make_pettingzoo_aec("classic/tictactoe-v3", "tictactoe_v3", config))


def _make_pettingzoo_aec(env_id: str, module: str, kwargs: dict[str, Any]) -> Any:
    """PettingZoo classic game ``env_id``'s AEC env (through ``pettingzoo.make``, or module ``module`` before
    PettingZoo 1.27); a missing PettingZoo or pygame raises :class:`~flowrl.errors.EnvError` naming the extra."""
    try:
        pettingzoo = importlib.import_module("pettingzoo")
        make = getattr(pettingzoo, "make", None)
        if make is None:
            return importlib.import_module(f"pettingzoo.classic.{module}").env(**kwargs)
        return make("aec", env_id, **kwargs)
    except Exception as exc:
        # PettingZoo's registry reports a game module that does not import (no pygame) as FailedToImport.
        missing = exc if isinstance(exc, ImportError) else exc.__cause__
        if isinstance(missing, ImportError):
            raise EnvError(
                f"PettingZoo's {env_id} needs the packages pettingzoo and pygame ({missing}): "
                f"{install_hint('pettingzoo')}"
            ) from exc
        raise
