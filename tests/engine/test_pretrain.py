"""Offline→online in one run: ``pretrain`` hands an offline algorithm's weights to the run's policies, and
``replay_prefill`` fills its replay buffer from recorded experiences before the first online iteration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flowrl import Trainer
from flowrl.data import DEFAULT_POLICY_ID
from flowrl.data.offline import OfflineData
from flowrl.engine.record import record_checkpoint
from flowrl.errors import ConfigError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SMALL_PPO = {"num_workers": 0, "train_batch_size": 256, "sgd_minibatch_size": 128, "num_sgd_iter": 2, "seed": 0}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """30 exploring episodes of an untrained PPO policy on CartPole (about 700 rows)."""
    root = tmp_path_factory.mktemp("pretrain")
    trainer = Trainer("ppo", "CartPole-v1", SMALL_PPO)
    try:
        checkpoint = trainer.save(root / "checkpoint")
    finally:
        trainer.stop()
    record_checkpoint(checkpoint, root / "data", episodes=30, seed=0, explore=True)
    return root / "data"


def weights(trainer: Trainer) -> dict[str, Any]:
    return trainer.workers.local_worker().get_weights([DEFAULT_POLICY_ID])[DEFAULT_POLICY_ID]


def test_pretraining_iterations_come_first_and_hand_their_weights_over(data: Path, tmp_path: Path) -> None:
    pretrain = {"algo": "bc", "input": str(data), "iterations": 2, "config": {"timesteps_per_iteration": 1000}}
    trainer = Trainer("ppo", "CartPole-v1", {**SMALL_PPO, "pretrain": pretrain})
    try:
        first = trainer.train()
        assert first["phase"] == "pretrain"
        assert first["timesteps_total"] == 0  # online env steps: none yet
        assert first["pretrain"]["algo"] == "bc" and first["pretrain"]["timesteps_total"] >= 1000
        assert "policy_loss" in first["info"]["learner"][DEFAULT_POLICY_ID]
        assert any("ReadOffline" in name for name in first["plan"]["operators"])  # the pretraining plan's X-ray
        pretrained = trainer.phases.pretraining
        assert pretrained is not None
        theirs = pretrained.trainer.workers.local_worker().get_weights([DEFAULT_POLICY_ID])[DEFAULT_POLICY_ID]
        assert all(np.array_equal(theirs[name], value) for name, value in weights(trainer).items())
        checkpoint = trainer.save(tmp_path / "mid")  # after one of the two pretraining iterations
        assert trainer.train()["phase"] == "pretrain"
        online = trainer.train()
        assert online["phase"] == "online" and online["timesteps_total"] >= 256
        assert "ReadOffline" not in str(online["plan"].get("operators", {}))
    finally:
        trainer.stop()
    resumed = Trainer("ppo", "CartPole-v1", {**SMALL_PPO, "pretrain": pretrain})
    try:
        resumed.restore(checkpoint)
        assert resumed.train()["phase"] == "pretrain"  # the second pretraining iteration, not a third
        assert resumed.train()["phase"] == "online"
    finally:
        resumed.stop()


def test_replay_prefill_fills_the_buffer_before_the_first_sample(data: Path) -> None:
    rows = OfflineData(data).num_rows
    trainer = Trainer(
        "dqn", "CartPole-v1", {"num_workers": 0, "seed": 0, "timesteps_per_iteration": 100, "replay_prefill": str(data)}
    )
    try:
        result = trainer.train()
        buffer = result["info"]["replay_buffer"]
        assert result["phase"] == "online"
        assert buffer["num_steps_added"] == rows + result["timesteps_total"]
        # A checkpoint remembers the prefill: a restored run does not add the rows again.
        assert trainer.phases.get_state()["prefilled_rows"] == rows
    finally:
        trainer.stop()


@pytest.mark.parametrize(
    ("algo", "config", "message"),
    [
        ("bc", {"input": "x", "pretrain": {"algo": "bc", "input": "x", "iterations": 1}}, "learns from recorded"),
        ("ppo", {"pretrain": {"algo": "ppo", "input": "x", "iterations": 1}}, "must be one of ['bc', 'marwil', 'cql']"),
        ("ppo", {"pretrain": {"algo": "bc", "iterations": 0}}, "pretrain needs 'input'"),
        ("ppo", {"pretrain": {"algo": "bc", "input": "x", "iterations": 1, "epochs": 2}}, "unknown key 'epochs'"),
    ],
)
def test_bad_pretrain_settings_are_refused_before_anything_starts(
    algo: str, config: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        Trainer(algo, "CartPole-v1", {"num_workers": 0, **config})


def test_pretraining_a_q_learner_with_bc_is_refused_naming_what_fits(data: Path) -> None:
    pretrain = {"algo": "bc", "input": str(data), "iterations": 1}
    with pytest.raises(ConfigError, match="weights cannot be handed over"):
        Trainer("dqn", "CartPole-v1", {"num_workers": 0, "pretrain": pretrain})


def test_replay_prefill_needs_a_replay_buffer(data: Path) -> None:
    with pytest.raises(ConfigError, match="no local replay buffer"):
        Trainer("ppo", "CartPole-v1", {**SMALL_PPO, "replay_prefill": str(data)})
