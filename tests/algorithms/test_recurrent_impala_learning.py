"""IMPALA with an LSTM learns StatelessCartPole-v1 (CartPole without the velocities) with one rollout
worker: tuned_examples/stateless-cartpole-lstm-impala.yaml, seed 0, within its step budget."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from flowrl import Trainer

pytestmark = [pytest.mark.learning, pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(600)]

EXAMPLE = Path(__file__).resolve().parents[2] / "tuned_examples" / "stateless-cartpole-lstm-impala.yaml"


def test_lstm_impala_learns_stateless_cartpole() -> None:
    spec = yaml.safe_load(EXAMPLE.read_text())
    threshold, budget = spec["stop"]["episode_reward_mean"], spec["stop"]["timesteps_total"]
    trainer = Trainer(spec["algo"], spec["env"], {**spec["config"], "num_cpus_per_worker": 0.5})
    best, curve = 0.0, []
    try:
        while best < threshold:
            result = trainer.train()
            best = max(best, result["episode_reward_mean"])
            curve.append(round(result["episode_reward_mean"], 1))
            if result["timesteps_total"] >= budget:
                break
    finally:
        trainer.stop()
    assert best >= threshold, f"LSTM-IMPALA reached {best:.1f} in {result['timesteps_total']} steps; curve {curve}"
