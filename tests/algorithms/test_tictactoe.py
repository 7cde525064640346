"""PPO self-play on TicTacToe (PettingZoo's tic-tac-toe: turn-based, action-masked), through the tuned example.

The learning test trains until the greedy policy wins at least 90% of its games against a uniformly random
legal player with the seats alternating (the level of a perfect minimax player, 90.1%: see
docs/multi-agent.md, "Turn-based games"), checked on 500 games every 5 iterations and confirmed on 1,000
others, within 200,000 env steps; no move of training or of the games may be illegal. The unit tests run
the tuned example briefly through ``flowrl train`` and play its checkpoint with ``load_policy``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from flowrl import Trainer, load_policy
from flowrl.cli import main as cli
from flowrl.envs import MatchResult, play_against_random

pytestmark = pytest.mark.unit

pytest.importorskip("pettingzoo")
pytest.importorskip("pygame")  # imported by PettingZoo's classic games

EXAMPLE = Path(__file__).resolve().parents[2] / "tuned_examples" / "tictactoe-ppo.yaml"
WIN_RATE = 0.9
BUDGET = 200_000
CHECK_EVERY, CHECK_GAMES, CONFIRM_GAMES = 5, 500, 1000


@pytest.mark.learning
@pytest.mark.timeout(600)
def test_ppo_self_play_wins_90_percent_against_a_random_player() -> None:
    spec = yaml.safe_load(EXAMPLE.read_text())
    trainer = Trainer(spec["algo"], spec["env"], {**spec["config"], "seed": 0})
    policy = trainer.workers.local_worker().get_policy()

    def greedy(obs: Any) -> Any:
        return policy.compute_single_action(obs, explore=False)

    curve: list[str] = []
    confirmed: MatchResult | None = None
    try:
        while True:
            result = trainer.train()
            steps = result["timesteps_total"]
            if result["training_iteration"] % CHECK_EVERY == 0 or steps >= BUDGET:
                check = play_against_random("TicTacToe", greedy, CHECK_GAMES, seed=0)
                curve.append(f"{steps}: {check.win_rate:.3f}")
                if check.win_rate >= WIN_RATE:
                    confirmed = play_against_random("TicTacToe", greedy, CONFIRM_GAMES, seed=CHECK_GAMES)
                    curve.append(f"confirmed on {CONFIRM_GAMES}: {confirmed.win_rate:.3f}")
                    if confirmed.win_rate >= WIN_RATE:
                        break
            if steps >= BUDGET:
                break
        illegal = sum(env.illegal_actions for env in trainer.workers.local_worker().envs)
    finally:
        trainer.stop()
    assert illegal == 0
    assert confirmed is not None and confirmed.win_rate >= WIN_RATE, f"after {steps} steps; win rates {curve}"
    assert confirmed.illegal_actions == 0
    print({seat: round(record.win_rate, 3) for seat, record in confirmed.by_seat.items()}, curve)


@pytest.mark.parametrize(
    ("algo", "config"),
    [
        ("ppo", {}),
        # Half the moves random (epsilon-greedy exploration), half the untrained argmax.
        ("dqn", {"exploration_config": {"type": "EpsilonGreedy", "epsilon": 0.5}}),
    ],
)
def test_no_illegal_move_in_20k_steps_of_acting_exploring_and_evaluating(algo: str, config: dict[str, Any]) -> None:
    trainer = Trainer(
        algo, "TicTacToe", {"num_workers": 0, "num_envs_per_worker": 50, "rollout_fragment_length": 100, **config}
    )
    try:
        worker = trainer.workers.local_worker()
        sampled = 0
        while sampled < 20_000:
            batch = worker.sample()
            sampled += batch.count
        rows = batch.policy_batches["default_policy"]
        assert rows["action_mask"][range(rows.count), rows["actions"]].all()
        assert sum(env.illegal_actions for env in worker.envs) == 0
        # Greedy self-play games: an illegal move would end one at -1 for the mover, 0 for the other.
        evaluation = trainer.evaluate(num_episodes=10, seed=0)
        assert evaluation["episode_reward_min"] == evaluation["episode_reward_max"] == 0.0
    finally:
        trainer.stop()


def test_the_tuned_example_trains_through_flowrl_train_and_its_checkpoint_plays(tmp_path: Path) -> None:
    argv = ["train", "--config", str(EXAMPLE), "--results-dir", str(tmp_path), "--quiet"]
    assert cli.main([*argv, "--stop-timesteps", "4096", "--set", "num_envs_per_worker=8"]) == 0
    [run] = tmp_path.iterdir()
    player = load_policy(run)
    record = play_against_random("TicTacToe", player.compute_action, num_games=20, seed=0)
    assert record.games == 20 and record.illegal_actions == 0
    # Evaluation plays self-play games: only the mover acts, within its mask (an illegal move would cost -1).
    assert cli.main(["evaluate", str(run), "--episodes", "4", "--seed", "0"]) == 0
