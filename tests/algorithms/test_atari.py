"""Atari through the Trainer: a short Pong run over the whole path (not learning), and the Pong tuned examples."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flowrl import Trainer
from flowrl.algorithms import get_algorithm
from flowrl.policy.models import CNNEncoder
from flowrl.runs.experiment import load_experiment_file

pytestmark = pytest.mark.unit

TUNED_EXAMPLES = Path(__file__).resolve().parents[2] / "tuned_examples"


@pytest.mark.atari
def test_a_short_pong_run_samples_trains_and_checkpoints(ray_session: None, tmp_path: Path) -> None:
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    config = {
        "num_workers": 0,
        "num_envs_per_worker": 2,
        "rollout_fragment_length": 64,
        "train_batch_size": 128,
        "sgd_minibatch_size": 64,
        "num_sgd_iter": 1,
        "compress_observations": True,
        "seed": 0,
        "env_config": {"repeat_action_probability": 0.0},
    }
    trainer = Trainer("ppo", "ALE/Pong-v5", config)
    try:
        policy = trainer.workers.local_worker().get_policy()
        assert isinstance(policy.model.encoder, CNNEncoder)  # frames of (4, 84, 84) go through the CNN
        before = {k: v.copy() for k, v in policy.get_weights().items()}
        for _ in range(6):
            result = trainer.train()
        assert result["timesteps_total"] == 6 * 128  # 3,072 frames
        learner = result["info"]["learner"]["default_policy"]
        assert np.isfinite(learner["policy_loss"]) and np.isfinite(learner["vf_loss"])
        assert any(not np.array_equal(before[k], v) for k, v in policy.get_weights().items())
        path = trainer.save(tmp_path)
    finally:
        trainer.stop()
    restored = Trainer.from_checkpoint(path)
    try:
        restored_weights = restored.workers.local_worker().get_policy().get_weights()
        assert all(np.array_equal(restored_weights[k], v) for k, v in policy.get_weights().items())
        assert restored.train()["timesteps_total"] == 7 * 128
    finally:
        restored.stop()


@pytest.mark.parametrize("name", ["pong-impala", "pong-apex"])
def test_the_pong_tuned_examples_are_valid_experiment_files(name: str) -> None:
    experiment = load_experiment_file(TUNED_EXAMPLES / f"{name}.yaml")
    assert experiment["env"] == "PongNoFrameskip-v4" and experiment["stop"]["episode_reward_mean"] == 18
    config = get_algorithm(experiment["algo"]).config_class.from_dict(experiment["config"])
    assert config.num_workers * config.num_cpus_per_worker == 32  # a small cluster
    assert config.env_config["episodic_life"] and config.env_config["clip_rewards"]
