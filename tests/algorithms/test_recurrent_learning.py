"""LSTM-PPO learns partially observable tasks where PPO without memory cannot, the same settings and step
budget for both, seed 0, both asserted: StatelessCartPole-v1 (CartPole without the velocities) and TMaze-v0
(a cue to remember along a corridor)."""

from __future__ import annotations

from typing import Any

import pytest

from flowrl import Trainer

pytestmark = [pytest.mark.learning, pytest.mark.timeout(600)]

BUDGET = 150_000
# tuned_examples/cartpole-ppo.yaml's settings (16 envs in the driver, 512-step batches, 10 epochs).
SETTINGS = {
    "seed": 0,
    "num_workers": 0,
    "num_envs_per_worker": 16,
    "rollout_fragment_length": 32,
    "train_batch_size": 512,
    "sgd_minibatch_size": 256,
    "num_sgd_iter": 10,
    "lr": 1e-3,
    "gamma": 0.98,
    "lambda": 0.8,
}
LSTM = {"fcnet_hiddens": [64], "use_lstm": True, "lstm_cell_size": 64, "max_seq_len": 32}

# tuned_examples/tmaze-lstm-ppo.yaml: a corridor of 10 steps between the cue and the junction, and
# sequences of 16 steps, so that most sequences hold a whole 11-step episode.
TMAZE_BUDGET = 30_000
TMAZE_SETTINGS = {**SETTINGS, "gamma": 0.99, "lambda": 0.95, "env_config": {"length": 10}}
TMAZE_LSTM = {"fcnet_hiddens": [32], "use_lstm": True, "lstm_cell_size": 32, "max_seq_len": 16}


def best_mean_return(
    env: str, settings: dict[str, Any], model: dict[str, Any], budget: int, stop_at: float
) -> tuple[float, int]:
    """The best episode_reward_mean within the budget (stopping once it reaches ``stop_at``), and the steps taken."""
    trainer = Trainer("ppo", env, {**settings, "model": model})
    best = -float("inf")
    try:
        while True:
            result = trainer.train()
            best = max(best, result["episode_reward_mean"])
            if best >= stop_at or result["timesteps_total"] >= budget:
                return best, result["timesteps_total"]
    finally:
        trainer.stop()


def test_lstm_ppo_learns_stateless_cartpole_where_ppo_without_memory_cannot() -> None:
    lstm_best, lstm_steps = best_mean_return("StatelessCartPole-v1", SETTINGS, LSTM, BUDGET, stop_at=150)
    assert lstm_best >= 150, f"LSTM-PPO reached {lstm_best:.1f} in {lstm_steps} steps"
    mlp = {"fcnet_hiddens": [64, 64]}
    mlp_best, _ = best_mean_return("StatelessCartPole-v1", SETTINGS, mlp, BUDGET, stop_at=float("inf"))
    assert mlp_best < 100, f"PPO without memory reached {mlp_best:.1f} in {BUDGET} steps"


def test_lstm_ppo_remembers_the_tmaze_cue_where_ppo_without_memory_cannot() -> None:
    # +1 for the cue's side, -1 for the other: without memory the junction looks the same whatever the cue,
    # so a policy's mean stays near 0 (a 100-episode mean of fair coin flips has a standard deviation of 0.1).
    lstm_best, lstm_steps = best_mean_return("TMaze-v0", TMAZE_SETTINGS, TMAZE_LSTM, TMAZE_BUDGET, stop_at=0.9)
    assert lstm_best >= 0.9, f"LSTM-PPO reached {lstm_best:.2f} in {lstm_steps} steps"
    mlp = {"fcnet_hiddens": [32, 32]}
    mlp_best, _ = best_mean_return("TMaze-v0", TMAZE_SETTINGS, mlp, TMAZE_BUDGET, stop_at=float("inf"))
    assert mlp_best < 0.5, f"PPO without memory reached {mlp_best:.2f} in {TMAZE_BUDGET} steps"
