"""MuJoCo through the Trainer: a short Hopper-v5 smoke run of TD3 (sample, train, checkpoint, restore, train on)
and of PPO, and the MuJoCo tuned examples (valid experiment files with their measured results written down)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from flowrl import Trainer
from flowrl.algorithms import get_algorithm, list_algorithms
from flowrl.runs.experiment import load_experiment_file

pytestmark = pytest.mark.unit

TUNED_EXAMPLES = Path(__file__).resolve().parents[2] / "tuned_examples"
MUJOCO_EXAMPLES = sorted(
    f"{env}-{algo}" for env in ("hopper", "halfcheetah", "walker2d") for algo in ("sac", "td3", "ppo")
)
ENV_IDS = {"hopper": "Hopper-v5", "halfcheetah": "HalfCheetah-v5", "walker2d": "Walker2d-v5"}
# Small networks and batches: this checks the path through MuJoCo, not learning.
TD3_SMOKE = {
    "num_workers": 0,
    "seed": 0,
    "rollout_fragment_length": 4,
    "train_batch_size": 32,
    "training_intensity": 32,
    "learning_starts": 200,
    "buffer_size": 5_000,
    "actor_hiddens": [32, 32],
    "critic_hiddens": [32, 32],
    "timesteps_per_iteration": 200,
}


def weights_of(trainer: Trainer) -> dict[str, np.ndarray]:
    return {k: v.copy() for k, v in trainer.workers.local_worker().get_policy().get_weights().items()}


@pytest.mark.integration
def test_td3_on_hopper_samples_trains_checkpoints_and_restores_into_a_trainer_that_trains_on(tmp_path: Path) -> None:
    pytest.importorskip("mujoco")
    trainer = Trainer("td3", "Hopper-v5", TD3_SMOKE)
    try:
        policy = trainer.workers.local_worker().get_policy()
        assert policy.observation_space.shape == (11,) and policy.action_space.shape == (3,)
        before = weights_of(trainer)
        for _ in range(2):
            result = trainer.train()
        assert result["timesteps_total"] == 400
        # One update of 32 rows per env step after learning_starts: 200 steps' worth, give or take a fragment.
        assert 150 * 32 <= result["info"]["num_steps_trained"] <= 210 * 32
        learner = result["info"]["learner"]["default_policy"]
        assert math.isfinite(learner["critic_loss"]) and math.isfinite(learner["mean_q"])
        assert result["episodes_total"] > 0 and math.isfinite(result["episode_reward_mean"])
        trained = weights_of(trainer)
        assert any(not np.array_equal(before[k], v) for k, v in trained.items())
        path = trainer.save(tmp_path)
    finally:
        trainer.stop()
    restored = Trainer.from_checkpoint(path)
    try:
        assert {k: v.tolist() for k, v in weights_of(restored).items()} == {k: v.tolist() for k, v in trained.items()}
        result = restored.train()
        assert result["timesteps_total"] == 600  # counts go on from the checkpoint's
        assert result["info"]["num_steps_trained"] >= 350 * 32  # and training does (the replay came back)
        assert any(not np.array_equal(trained[k], v) for k, v in weights_of(restored).items())
    finally:
        restored.stop()


@pytest.mark.integration
def test_ppo_on_hopper_samples_and_trains_an_iteration() -> None:
    pytest.importorskip("mujoco")
    config = {
        "num_workers": 0,
        "seed": 0,
        "rollout_fragment_length": 256,
        "train_batch_size": 256,
        "sgd_minibatch_size": 64,
        "num_sgd_iter": 1,
        "observation_filter": "MeanStdFilter",
        "model": {"fcnet_hiddens": [32, 32]},
    }
    trainer = Trainer("ppo", "Hopper-v5", config)
    try:
        before = weights_of(trainer)
        result = trainer.train()
        assert result["timesteps_total"] == 256 and result["info"]["num_steps_trained"] == 256
        assert result["episodes_total"] > 0  # Hopper falls within 256 random steps
        assert math.isfinite(result["episode_reward_mean"]) and result["episode_reward_mean"] > 0
        learner = result["info"]["learner"]["default_policy"]
        assert math.isfinite(learner["policy_loss"]) and math.isfinite(learner["vf_loss"])
        assert any(not np.array_equal(before[k], v) for k, v in weights_of(trainer).items())
    finally:
        trainer.stop()


@pytest.mark.parametrize("name", MUJOCO_EXAMPLES)
def test_the_mujoco_tuned_examples_are_valid_and_say_what_they_were_measured_to_reach(name: str) -> None:
    path = TUNED_EXAMPLES / f"{name}.yaml"
    experiment = load_experiment_file(path)
    env, algo = name.split("-")
    assert experiment["algo"] == algo and experiment["env"] == ENV_IDS[env]
    assert experiment["stop"]["timesteps_total"] == 1_000_000  # rl-zoo's budget for these envs
    header = path.read_text(encoding="utf-8").split("\nalgo:")[0]
    assert "measured" in header.lower() and "rl-zoo" in header  # what it reached here, and what rl-zoo reports
    if algo not in list_algorithms():
        pytest.skip(f"algorithm {algo!r} is not built in this checkout")
    config = get_algorithm(algo).config_class.from_dict(experiment["config"])
    assert config.num_workers == 0 and config.seed == 0
    if algo != "ppo":  # one gradient update per env step, as rl-zoo's MuJoCo settings
        assert config.training_intensity == config.train_batch_size
