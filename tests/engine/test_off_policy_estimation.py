"""Off-policy estimation through the Trainer: an offline run reports each estimator at its evaluations, and
data or action spaces the estimators cannot serve fail before training."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from flowrl import Trainer
from flowrl.errors import ConfigError, OfflineDataError
from flowrl.storage.results import flatten_result

# A short BC iteration and one evaluation episode: what is tested is what the evaluation reports.
BC_TINY = {
    "num_workers": 0,
    "seed": 0,
    "train_batch_size": 128,
    "timesteps_per_iteration": 256,
    "evaluation_num_episodes": 1,
}


def record(env: str, out: Path, steps: int) -> Path:
    """``steps`` steps of an untrained PG policy on ``env``, written as experiences (with action_logp)."""
    with Trainer(
        algo="pg",
        env=env,
        config={
            "num_workers": 0,
            "seed": 0,
            "output": str(out),
            "rollout_fragment_length": steps,
            "train_batch_size": steps,
        },
    ) as trainer:
        trainer.train()
    return out


@pytest.fixture(scope="module")
def cartpole_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record("CartPole-v1", tmp_path_factory.mktemp("cartpole"), 600)


@pytest.mark.integration
@pytest.mark.usefixtures("ray_session")
def test_an_offline_run_reports_every_estimator_at_its_evaluations(cartpole_data: Path) -> None:
    methods = ["is", "wis", "dm", "dr"]
    config = {**BC_TINY, "input": str(cartpole_data), "off_policy_estimation_methods": methods}
    with Trainer(
        algo="bc", env="CartPole-v1", config=config
    ) as trainer:  # Ray is up: the files stream through Ray Data
        result = trainer.train()
    estimates = result["evaluation"]["off_policy_estimation"]
    assert list(estimates) == methods
    behavior = {figures["v_behavior"] for figures in estimates.values()}
    assert len(behavior) == 1 and 1 < behavior.pop() < 100  # one recorded value, a discounted CartPole return
    for figures in estimates.values():
        assert all(math.isfinite(value) for value in figures.values())
        assert figures["v_gain"] == pytest.approx(figures["v_target"] / figures["v_behavior"])
    flat = flatten_result(result)
    assert {f"evaluation/off_policy_estimation/{m}/v_target" for m in methods} <= set(flat)


@pytest.mark.unit
def test_data_without_action_logp_fails_before_training(cartpole_data: Path, tmp_path: Path) -> None:
    for path in cartpole_data.glob("*.parquet"):
        pq.write_table(pq.read_table(path).drop_columns(["action_logp"]), tmp_path / path.name)
    config: dict[str, Any] = {**BC_TINY, "input": str(tmp_path), "off_policy_estimation_methods": ["dm", "wis", "dr"]}
    with pytest.raises(OfflineDataError, match=r"lacks action_logp, which \['wis', 'dr'\] need"):
        Trainer(algo="bc", env="CartPole-v1", config=config)
    config["off_policy_estimation_methods"] = ["dm"]  # the direct method weighs no action
    with Trainer(algo="bc", env="CartPole-v1", config=config) as trainer:
        assert "dm" in trainer.train()["evaluation"]["off_policy_estimation"]


@pytest.mark.unit
def test_the_fitted_estimators_refuse_continuous_actions(tmp_path: Path) -> None:
    data = record("Pendulum-v1", tmp_path, 200)
    config = {**BC_TINY, "input": str(data), "off_policy_estimation_methods": ["is", "dr"]}
    with pytest.raises(
        ConfigError, match=r"\['dr'\] fit a Q-function over discrete actions, but the action space is Box"
    ):
        Trainer(algo="bc", env="Pendulum-v1", config=config)
