"""LSTM-PPO learns StatelessCartPole-v1 (CartPole without the velocities), where PPO without memory cannot:
the same settings and step budget, seed 0, both asserted."""

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


def best_mean_return(model: dict[str, Any], stop_at: float) -> tuple[float, int]:
    """The best episode_reward_mean within the budget (stopping once it reaches ``stop_at``), and the steps taken."""
    trainer = Trainer("ppo", "StatelessCartPole-v1", {**SETTINGS, "model": model})
    best = 0.0
    try:
        while True:
            result = trainer.train()
            best = max(best, result["episode_reward_mean"])
            if best >= stop_at or result["timesteps_total"] >= BUDGET:
                return best, result["timesteps_total"]
    finally:
        trainer.stop()


def test_lstm_ppo_learns_stateless_cartpole_where_ppo_without_memory_cannot() -> None:
    lstm_best, lstm_steps = best_mean_return(LSTM, stop_at=150)
    assert lstm_best >= 150, f"LSTM-PPO reached {lstm_best:.1f} in {lstm_steps} steps"
    mlp_best, _ = best_mean_return({"fcnet_hiddens": [64, 64]}, stop_at=float("inf"))
    assert mlp_best < 100, f"PPO without memory reached {mlp_best:.1f} in {BUDGET} steps"
