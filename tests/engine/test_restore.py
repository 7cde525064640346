"""Restores are checked before they change anything; the trainer's config wins; state is complete and portable.

Small trainers (``num_workers`` 0 or 1, tiny batches) share the session's Ray.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fakes import fingerprint, snapshot_of_a_vanished_class

from flowrl import Trainer
from flowrl.data import DEFAULT_POLICY_ID
from flowrl.errors import CheckpointError
from flowrl.operators import STEPS_TRAINED_COUNTER
from flowrl.storage.checkpoints import read_checkpoint, write_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
SMALL_PPO = {
    "num_workers": 0,
    "train_batch_size": 40,
    "rollout_fragment_length": 40,
    "sgd_minibatch_size": 20,
    "num_sgd_iter": 1,
    "seed": 0,
    "model": {"fcnet_hiddens": [16]},
}


@pytest.fixture(scope="module")
def ppo_checkpoint(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A PPO CartPole-v1 checkpoint after two iterations."""
    with Trainer("ppo", "CartPole-v1", SMALL_PPO) as trainer:
        trainer.train()
        trainer.train()
        return trainer.save(tmp_path_factory.mktemp("ppo"))


@pytest.mark.filterwarnings("ignore:.*CartPole-v0 is out of date")
@pytest.mark.parametrize(
    ("algo", "env", "config", "expected"),
    [
        ("ppo", "CartPole-v0", SMALL_PPO, ["env: the checkpoint's is 'CartPole-v1', this trainer's 'CartPole-v0'"]),
        (
            "ppo",
            "CartPole-v1",
            {**SMALL_PPO, "model": {"fcnet_hiddens": [8]}},
            ["parameter", "has shape [16, 4] in the checkpoint, [8, 4] in this trainer"],
        ),
        (
            "pg",
            "CartPole-v1",
            {k: v for k, v in SMALL_PPO.items() if k not in ("sgd_minibatch_size", "num_sgd_iter")},
            ["algorithm: the checkpoint's is 'ppo', this trainer's 'pg'"],
        ),
        (
            "ppo",
            "Acrobot-v1",
            SMALL_PPO,
            ["observation space is Box", "action space is Discrete(2), this trainer's Discrete(3)"],
        ),
    ],
    ids=["same-shapes-other-env", "other-hidden-sizes", "other-algorithm", "other-spaces"],
)
def test_a_checkpoint_that_does_not_fit_is_refused_and_nothing_changes(
    ppo_checkpoint: str, algo: str, env: str, config: dict[str, Any], expected: list[str]
) -> None:
    with Trainer(algo, env, config) as trainer:
        trainer.train()
        before = fingerprint(trainer)
        with pytest.raises(CheckpointError) as info:
            trainer.restore(ppo_checkpoint)
        for text in expected:
            assert text in str(info.value)
        assert fingerprint(trainer) == before
        assert trainer.restore_report is None


def test_config_overrides_win_over_the_optimizer_state_and_coefficients(ppo_checkpoint: str) -> None:
    state, _ = read_checkpoint(ppo_checkpoint)
    saved_lr = state["config"]["lr"]
    overrides = {"lr": 1e-5, "kl_coeff": 0.5, "entropy_coeff": 0.01}
    with Trainer.from_checkpoint(ppo_checkpoint, config_overrides=overrides) as trainer:
        policy = trainer.workers.local_worker().get_policy()
        assert [group["lr"] for group in policy.optimizer.param_groups] == [1e-5]
        assert policy.optimizer.state_dict()["state"]  # the Adam moments did come from the checkpoint
        assert policy.coeffs["kl_coeff"] == 0.5
        result = trainer.train()
    recorded = result["restore"]["config_overrides"]
    assert recorded["lr"] == {"checkpoint": saved_lr, "now": 1e-5}
    assert set(recorded) == {"lr", "kl_coeff", "entropy_coeff"}
    assert result["restore"]["checkpoint"].endswith(f"{Path(ppo_checkpoint).name}'")


def test_without_overrides_the_optimizer_settings_are_the_checkpoints(ppo_checkpoint: str) -> None:
    state, _ = read_checkpoint(ppo_checkpoint)
    with Trainer.from_checkpoint(ppo_checkpoint) as trainer:
        assert trainer.restore_report is not None and trainer.restore_report["config_overrides"] == {}
        assert trainer.workers.local_worker().get_policy().optimizer.param_groups[0]["lr"] == state["config"]["lr"]


def test_a_missing_target_network_is_a_partial_restore_refused_unless_allowed(tmp_path: Path) -> None:
    config = {"num_workers": 0, "learning_starts": 20, "timesteps_per_iteration": 40, "train_batch_size": 8, "seed": 0}
    with Trainer("dqn", "CartPole-v1", config) as trainer:
        trainer.train()
        state = trainer.get_state()
        state["worker"]["policies"][DEFAULT_POLICY_ID]["target"] = None
        before = fingerprint(trainer)
        with pytest.raises(CheckpointError, match="policy 'default_policy': the checkpoint has no target network"):
            trainer.set_state(state)
        assert fingerprint(trainer) == before
        trainer.set_state(state, allow_partial=True)
        result = trainer.train()
    assert any("target network" in problem for problem in result["restore"]["partial"])


def test_a_replay_shard_count_change_is_refused_unless_allowed(tmp_path: Path) -> None:
    config = {
        "num_workers": 1,
        "num_cpus_per_worker": 0.25,
        "num_replay_shards": 2,
        "rollout_fragment_length": 20,
        "learning_starts": 40,
        "train_batch_size": 16,
        "timesteps_per_iteration": 100,
        "seed": 0,
    }
    with Trainer("apex", "CartPole-v1", config) as trainer:
        trainer.train()
        path = trainer.save(tmp_path)
    with pytest.raises(CheckpointError, match="replay shards: the checkpoint holds 2, this trainer has 1"):
        Trainer.from_checkpoint(path, config_overrides={"num_replay_shards": 1})
    with Trainer.from_checkpoint(path, config_overrides={"num_replay_shards": 1}, allow_partial=True) as restored:
        report = restored.restore_report
        assert report is not None and report["partial"] and "num_replay_shards" in report["config_overrides"]
        [shard] = restored.resources.get_state()["replay_shards"]
        assert shard["num_steps_added"] == 0  # the contents of two shards did not fit into one


def test_a_checkpoint_of_two_workers_restores_into_one(tmp_path: Path) -> None:
    config = {**SMALL_PPO, "num_workers": 2, "num_cpus_per_worker": 0.25, "rollout_fragment_length": 20}
    with Trainer("ppo", "CartPole-v1", config) as trainer:
        trainer.train()
        path = trainer.save(tmp_path)
        saved = fingerprint(trainer)
    state, _ = read_checkpoint(path)
    assert sorted(state["remote_workers"]) == [1, 2]
    with Trainer.from_checkpoint(path, config_overrides={"num_workers": 1}) as restored:
        assert {k: v for k, v in fingerprint(restored).items() if k != "iteration"} == {
            k: v for k, v in saved.items() if k != "iteration"
        }
        report = restored.restore_report
        assert report is not None and report["config_overrides"]["num_workers"] == {"checkpoint": 2, "now": 1}
        assert report["envs_restarted"] == {}  # worker 1 took its own envs' episodes back
        result = restored.train()
    assert result["timesteps_total"] == saved["counters"]["num_steps_sampled"] + config["train_batch_size"]
    assert result["num_healthy_workers"] == 1


def test_an_env_snapshot_that_does_not_load_restarts_that_envs_episode_and_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = {**SMALL_PPO, "num_workers": 1, "num_cpus_per_worker": 0.25, "num_envs_per_worker": 2}
    with Trainer("ppo", "CartPole-v1", config) as trainer:
        trainer.train()
        state, metadata = read_checkpoint(trainer.save(tmp_path / "saved"))
    envs = state["remote_workers"][1]["sampler"]["envs"]
    assert all(snapshot is not None for snapshot in envs)  # CartPole pickles whole
    envs[1] = snapshot_of_a_vanished_class()  # worker 1's env 1, as saved by another version of its code
    planted = write_checkpoint(tmp_path / "planted", state, metadata)
    with Trainer.from_checkpoint(planted) as restored:
        report = restored.restore_report
        assert report is not None and report["envs_restarted"] == {1: [1]}
        assert restored.train()["restore"]["envs_restarted"] == {1: [1]}
    assert (
        "these envs (worker index: vector indices) could not be restored mid-episode and started new episodes: "
        "{1: [1]} (an env saved without its state, or whose saved state does not load here" in caplog.text
    )


def test_remote_workers_resume_their_episodes_and_random_streams(tmp_path: Path) -> None:
    config = {**SMALL_PPO, "num_workers": 1, "num_cpus_per_worker": 0.25}
    with Trainer("ppo", "CartPole-v1", config) as trainer:
        trainer.train()
        path = trainer.save(tmp_path)
        expected = [trainer.train()["episode_reward_mean"] for _ in range(2)]
        expected_fingerprint = fingerprint(trainer)
    with Trainer.from_checkpoint(path) as restored:
        assert [restored.train()["episode_reward_mean"] for _ in range(2)] == expected
        assert fingerprint(restored) == expected_fingerprint


def test_async_checkpoints_count_the_steps_the_saved_weights_were_trained_on() -> None:
    config = {
        "num_workers": 1,
        "num_cpus_per_worker": 0.25,
        "rollout_fragment_length": 20,
        "train_batch_size": 20,
        "min_iter_time_s": 0,
        "seed": 0,
    }
    with Trainer("impala", "CartPole-v1", config) as trainer:
        for _ in range(3):
            trainer.train()
        learner = trainer.resources.need_learner()
        with trainer.workers.local_worker().lock:  # the learner is paused: nothing trains in between
            trained = learner.num_steps_trained
            state = trainer.get_state()
            weights = trainer.workers.local_worker().get_policy().get_weights()
    counters, _ = state["plan"]["metrics"]
    assert counters[STEPS_TRAINED_COUNTER] == trained > 0
    saved = state["worker"]["policies"][DEFAULT_POLICY_ID]["weights"]
    assert all(np.array_equal(saved[name], weights[name]) for name in weights)


LOAD_POLICY = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import ray
    import flowrl
    policy = flowrl.load_policy(sys.argv[1])
    obs = np.load(sys.argv[2])
    actions = policy.compute_actions(obs)
    print("RESULT " + json.dumps({"actions": actions.tolist(), "ray": ray.is_initialized()}))
    """
)


def test_load_policy_acts_like_the_trainer_without_ray(tmp_path: Path) -> None:
    with Trainer("ppo", "CartPole-v1", SMALL_PPO) as trainer:
        trainer.train()
        path = trainer.save(tmp_path)
        rng = np.random.default_rng(0)
        obs = rng.uniform(-2, 2, size=(1000, 4)).astype(np.float32)
        expected, _ = trainer.workers.local_worker().get_policy().compute_actions(obs, explore=False)
    # Loading the pickle would run this: load_policy must never open it.
    marker = tmp_path / "pwned"
    (Path(path) / "state.pkl").write_bytes(b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR.")
    np.save(tmp_path / "obs.npy", obs)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run(
        [sys.executable, "-c", LOAD_POLICY, path, str(tmp_path / "obs.npy")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=env,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    loaded = json.loads(lines[-1][len("RESULT ") :])
    assert loaded["ray"] is False
    assert loaded["actions"] == expected.tolist()
    assert not marker.exists()
    with pytest.raises(CheckpointError):  # the full checkpoint is no longer usable: it was replaced
        read_checkpoint(path)
