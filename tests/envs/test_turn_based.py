"""Turn-based (AEC) envs: TurnBasedEnv's turn order, rewards, final steps and masks, the built-in TicTacToe,
the creators that wrap AEC envs, and games against a random player."""

from __future__ import annotations

import sys
import warnings
from typing import Any, ClassVar

import cloudpickle
import numpy as np
import pytest
from gymnasium import spaces

from flowrl.envs import (
    MatchResult,
    TicTacToe,
    TurnBasedEnv,
    acting_agents,
    check_multi_agent_env,
    get_env_creator,
    is_multi_agent_env,
    make_env,
    play_against_random,
    register_env,
    registry,
)
from flowrl.envs.turn_based import wrap_turn_based
from flowrl.errors import EnvCheckError, EnvError

pytestmark = pytest.mark.unit

pytest.importorskip("pettingzoo")
pytest.importorskip("pygame")  # imported by PettingZoo's classic games

from tally import Tally  # noqa: E402 - after the skips: it subclasses PettingZoo's AECEnv


def play(env: TurnBasedEnv, moves: list[int]) -> list[tuple[Any, ...]]:
    """Play ``moves`` in turn; each step's mover and its five dicts."""
    steps = []
    for move in moves:
        mover = env.agent_selection
        steps.append((mover, *env.step({mover: move})))
    return steps


# ---- TurnBasedEnv


def test_rewards_reach_each_agent_at_its_next_turn_and_every_agent_finishes_in_the_last_step() -> None:
    env = TurnBasedEnv(Tally())
    obs, infos = env.reset(seed=0)
    assert env.agents == ["a", "b"] and set(obs) == set(infos) == {"a", "b"}
    assert env.agent_selection == "a" and acting_agents(env) == ["a"]
    steps = play(env, [0, 0, 0, 0])
    assert [mover for mover, *_ in steps] == ["a", "b", "a", "b"]
    # What each earned since its own last move arrives when its turn comes; the rest at the end.
    assert [rewards for _, _, rewards, *_ in steps] == [
        {"a": 0.0, "b": 10.0},
        {"a": 11.0, "b": 0.0},
        {"a": 0.0, "b": 11.0},
        {"a": 11.0, "b": 1.0},
    ]
    *_, (_, last_obs, _, terminations, truncations, last_infos) = steps
    assert terminations == {"a": True, "b": True} and truncations == {"a": False, "b": False}
    assert set(last_obs) == set(last_infos) == {"a", "b"} and last_obs["a"].tolist() == [4.0]
    assert env.agents == [] and env.agent_selection is None and acting_agents(env) == []
    # Every step's dicts are keyed by the agents in the game: both observe every move.
    assert all(set(obs) == {"a", "b"} for _, obs, *_ in steps)


def test_only_the_movers_action_is_used() -> None:
    env = TurnBasedEnv(Tally())
    env.reset()
    env.step({"a": 1, "b": 0})  # b's action is ignored: it is a's turn
    assert env.agent_selection == "b"
    with pytest.raises(EnvError, match=r"no action for 'b', whose turn it is"):
        env.step({"a": 0})
    with pytest.raises(EnvError, match=r"action for 'c', which is not in the game"):
        env.step({"b": 0, "c": 0})
    play(env, [0, 0, 0])
    with pytest.raises(EnvError, match=r"the episode is over; call reset\(\)"):
        env.step({"a": 0})


@pytest.mark.filterwarnings("ignore:The old environment creation API:DeprecationWarning")  # pettingzoo.test's imports
def test_an_aec_env_passes_both_checkers_once_wrapped() -> None:
    parallel_api_test = pytest.importorskip("pettingzoo.test").parallel_api_test
    check_multi_agent_env(TurnBasedEnv(Tally()), num_steps=30)
    check_multi_agent_env(Tally(), num_steps=30)  # the checker wraps an AEC env itself
    parallel_api_test(TurnBasedEnv(Tally()), num_cycles=30)


def test_the_checker_needs_a_turn_based_envs_mover_among_its_agents() -> None:
    class LostTurn(TurnBasedEnv):
        def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
            result = super().reset(seed=seed, options=options)
            self.agent_selection = "c"
            return result

    with pytest.raises(EnvCheckError, match=r"before step 1 of check_multi_agent_env, env.agent_selection is 'c'"):
        check_multi_agent_env(LostTurn(Tally()))


def test_an_aec_env_that_cannot_be_wrapped_says_what_it_lacks() -> None:
    class HalfAEC:
        possible_agents: ClassVar[list[str]] = ["a"]

        def last(self) -> None: ...

        def agent_iter(self) -> None: ...

    def make_half(env_config: dict[str, Any]) -> Any:
        return HalfAEC()

    with pytest.raises(EnvError, match=r"TurnBasedEnv cannot wrap: it has no method reset, step, observe"):
        make_env(make_half)
    with pytest.raises(EnvCheckError, match=r"it needs PettingZoo's AEC API"):
        check_multi_agent_env(HalfAEC())


# ---- TicTacToe


def test_tictactoe_is_a_builtin_turn_based_env_with_masked_observations() -> None:
    env = make_env("TicTacToe", seed=0)
    assert isinstance(env, TicTacToe) and is_multi_agent_env(env) and env.turn_based
    assert env.possible_agents == ["player_1", "player_2"]
    space = env.observation_space("player_1")
    assert space is env.observation_space("player_1")
    assert isinstance(space, spaces.Dict)
    assert set(space.spaces) == {"observations", "action_mask"} and space["observations"].shape == (3, 3, 2)
    obs, _ = env.reset(seed=0)
    assert obs["player_1"]["action_mask"].tolist() == [1] * 9
    assert obs["player_2"]["action_mask"].tolist() == [0] * 9  # not its turn
    assert get_env_creator("TicTacToe") is TicTacToe


def test_a_won_game_pays_the_winner_and_the_loser_in_its_last_step() -> None:
    env = TicTacToe()
    env.reset()
    # X (player_1) fills cells 0, 1, 2, O answers 3 and 4.
    steps = play(env, [0, 3, 1, 4, 2])
    assert [mover for mover, *_ in steps] == ["player_1", "player_2"] * 2 + ["player_1"]
    assert all(rewards == {"player_1": 0.0, "player_2": 0.0} for _, _, rewards, *_ in steps[:-1])
    _, obs, rewards, terminations, _, _ = steps[-1]
    assert rewards == {"player_1": 1.0, "player_2": -1.0}
    assert terminations == {"player_1": True, "player_2": True} and env.agents == []
    assert obs["player_1"]["observations"][..., 0].sum() == 3  # its own marks, in its last observation
    _, obs, *_ = steps[1]
    assert obs["player_1"]["action_mask"].tolist() == [0, 1, 1, 0, 1, 1, 1, 1, 1]  # the mover's legal moves
    assert env.illegal_actions == 0


def test_an_illegal_move_is_counted_and_loses_the_game() -> None:
    env = TicTacToe()
    env.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PettingZoo warns of the illegal move
        (_, _, _, _, _, _), (_, _, rewards, terminations, _, _) = play(env, [4, 4])
    assert env.illegal_actions == 1
    assert rewards == {"player_1": 0.0, "player_2": -1.0} and all(terminations.values())


def test_tictactoe_passes_both_checkers() -> None:
    parallel_api_test = pytest.importorskip("pettingzoo.test").parallel_api_test
    env = TicTacToe()
    check_multi_agent_env(env, num_steps=300)  # samples legal moves from the masks
    assert env.illegal_actions == 0
    parallel_api_test(TicTacToe(), num_cycles=100)


def test_tictactoe_checks_its_env_config() -> None:
    with pytest.raises(EnvError, match=r"TicTacToe got unknown env_config keys \['size'\]"):
        make_env("TicTacToe", {"size": 4})


def test_tictactoe_without_pettingzoo_says_which_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pettingzoo", None)
    with pytest.raises(EnvError, match=r"needs the packages pettingzoo and pygame .*pip install -e '\.\[pettingzoo\]'"):
        make_env("TicTacToe")


# ---- creators


def test_creators_and_registered_names_wrap_aec_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_REGISTRY", {})
    register_env("tally", lambda cfg: Tally(**cfg))
    env = make_env("tally", {"moves": 2})
    assert isinstance(env, TurnBasedEnv) and env.aec.moves == 2
    creator = get_env_creator(lambda cfg: Tally())
    assert isinstance(cloudpickle.loads(cloudpickle.dumps(creator))({}), TurnBasedEnv)
    assert wrap_turn_based(env) is env
    # A creator that cannot make an AEC env is given back as it is.
    assert get_env_creator(TicTacToe) is TicTacToe


# ---- games against a random player


def first_legal(obs: dict[str, np.ndarray]) -> int:
    return int(np.flatnonzero(obs["action_mask"])[0])


def test_play_against_random_alternates_seats_and_counts_outcomes() -> None:
    result = play_against_random("TicTacToe", first_legal, num_games=40, seed=0)
    assert isinstance(result, MatchResult) and result.games == 40
    assert result.wins + result.draws + result.losses == 40 and result.illegal_actions == 0
    assert {seat: record.games for seat, record in result.by_seat.items()} == {"player_1": 20, "player_2": 20}
    assert result.win_rate + result.draw_rate + result.loss_rate == pytest.approx(1.0)
    assert play_against_random(TicTacToe(), first_legal, num_games=40, seed=0) == result  # seeded: the same games


def test_a_player_that_always_takes_the_centre_makes_illegal_moves() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = play_against_random("TicTacToe", lambda obs: 4, num_games=10, seed=0)
    assert result.illegal_actions > 0 and result.losses >= result.illegal_actions


def test_play_against_random_needs_a_multi_agent_env() -> None:
    with pytest.raises(EnvError, match=r"needs a multi-agent env"):
        play_against_random("CartPole-v1", lambda obs: 0, num_games=1)
    with pytest.raises(EnvError, match=r"num_games >= 1"):
        play_against_random("TicTacToe", first_legal, num_games=0)
