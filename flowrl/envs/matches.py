"""Games of a player against uniformly random legal players, with win, draw and loss rates per seat.

:func:`play_against_random` is how a trained policy for a turn-based game (tic-tac-toe, ...) is
judged: it plays ``num_games`` games, taking each seat in turn (``possible_agents[g % n]`` in game
``g``), while every other seat picks uniformly among its legal moves (its observation's action mask;
any action of its space without one). A game is won when the player's return is higher than every
other seat's, drawn when it ties the best of them, and lost otherwise (for tic-tac-toe: +1, 0, -1).

The player is any callable ``observation -> action`` that takes an observation as the env gives it
(a masked one with its ``"action_mask"``), e.g. ``lambda obs: policy.compute_single_action(obs,
explore=False)`` for a flowrl :class:`~flowrl.policy.Policy`, or ``flowrl.load_policy(path).compute_action``
for an exported one; both honour the mask.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from gymnasium import spaces

from flowrl.envs.flatten import action_mask_of
from flowrl.envs.multi_agent import AgentID, _is_aec_env, acting_agents, is_multi_agent_env
from flowrl.envs.registry import EnvSpec, close_env, make_env
from flowrl.envs.turn_based import wrap_turn_based
from flowrl.errors import EnvError

Player = Callable[[Any], Any]
"""A player: its observation (as the env returns it) -> its action."""


@dataclasses.dataclass(frozen=True)
class Record:
    """Wins, draws and losses of a set of games, and their rates."""

    wins: int = 0
    draws: int = 0
    losses: int = 0

    @property
    def games(self) -> int:
        """How many games were played."""
        return self.wins + self.draws + self.losses

    @property
    def win_rate(self) -> float:
        """The fraction of the games won (0.0 for no games)."""
        return self.wins / self.games if self.games else 0.0

    @property
    def draw_rate(self) -> float:
        """The fraction of the games drawn (0.0 for no games)."""
        return self.draws / self.games if self.games else 0.0

    @property
    def loss_rate(self) -> float:
        """The fraction of the games lost (0.0 for no games)."""
        return self.losses / self.games if self.games else 0.0

    def with_outcome(self, outcome: int) -> Record:
        """This record with one more game: ``outcome`` 1 won, 0 drawn, -1 lost."""
        return Record(self.wins + (outcome > 0), self.draws + (outcome == 0), self.losses + (outcome < 0))


@dataclasses.dataclass(frozen=True)
class MatchResult(Record):
    """A player's record against random players: in all games, and ``by_seat`` (agent id -> :class:`Record`
    of the games it played in that seat). ``illegal_actions``: the player's moves against its action mask."""

    by_seat: Mapping[AgentID, Record] = dataclasses.field(default_factory=dict)
    illegal_actions: int = 0


def play_against_random(
    env: EnvSpec | Any,
    player: Player,
    num_games: int = 100,
    *,
    seed: int = 0,
    env_config: dict[str, Any] | None = None,
) -> MatchResult:
    """``player``'s record in ``num_games`` games of ``env`` against uniformly random legal players.

    ``env``: a multi-agent env (a turn-based one such as ``TicTacToe``, or a PettingZoo AEC env, which
    is wrapped), or a name or creator of one, made with ``env_config`` and closed afterwards. Game ``g``
    resets with ``seed + g`` and the player takes seat ``possible_agents[g % n]``; the random players draw
    from a generator seeded with ``seed``. Raises :class:`~flowrl.errors.EnvError` for a single-agent env
    or ``num_games`` < 1.
    """
    if num_games < 1:
        raise EnvError(f"play_against_random needs num_games >= 1, got {num_games}")
    made = isinstance(env, str) or (callable(env) and not is_multi_agent_env(env) and not _is_aec_env(env))
    instance: Any = make_env(env, env_config) if made else wrap_turn_based(env)
    try:
        if not is_multi_agent_env(instance):
            raise EnvError(
                f"play_against_random needs a multi-agent env with seats to take; got {type(instance).__name__}"
            )
        rng = np.random.default_rng(seed)
        seats = list(instance.possible_agents)
        total, by_seat, illegal = Record(), {seat: Record() for seat in seats}, 0
        for game in range(num_games):
            seat = seats[game % len(seats)]
            outcome, mistakes = _play(instance, player, seat, rng, seed + game)
            total, illegal = total.with_outcome(outcome), illegal + mistakes
            by_seat[seat] = by_seat[seat].with_outcome(outcome)
    finally:
        if made:
            close_env(instance)
    return MatchResult(total.wins, total.draws, total.losses, by_seat=by_seat, illegal_actions=illegal)


def _play(env: Any, player: Player, seat: AgentID, rng: np.random.Generator, seed: int) -> tuple[int, int]:
    """One game with ``player`` in ``seat``: its outcome (1, 0, -1) and the player's illegal moves."""
    obs, infos = env.reset(seed=seed)
    returns: dict[AgentID, float] = dict.fromkeys(env.possible_agents, 0.0)
    illegal = 0
    while env.agents:
        actions = {}
        for agent in acting_agents(env):
            mask = action_mask_of(obs.get(agent), infos.get(agent))
            if agent == seat:
                actions[agent] = player(obs[agent])
                illegal += mask is not None and not _is_legal(mask, actions[agent])
            else:
                actions[agent] = _random_action(env.action_space(agent), mask, rng)
        obs, rewards, _, _, infos = env.step(actions)
        for agent, reward in rewards.items():
            returns[agent] = returns.get(agent, 0.0) + float(reward)
    best_other = max(value for agent, value in returns.items() if agent != seat)
    return int(np.sign(returns[seat] - best_other)), illegal


def _random_action(space: spaces.Space[Any], mask: Any, rng: np.random.Generator) -> Any:
    if mask is not None:
        legal = np.flatnonzero(np.asarray(mask))
        if len(legal):
            return int(rng.choice(legal))
    if isinstance(space, spaces.Discrete):
        return int(space.start + rng.integers(space.n))
    return space.sample()


def _is_legal(mask: Any, action: Any) -> bool:
    try:
        return bool(np.asarray(mask)[int(action)])
    except (TypeError, ValueError, IndexError):
        return False
