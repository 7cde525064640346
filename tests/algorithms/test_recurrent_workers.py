"""LSTM-PPO on a remote rollout worker: its fragments of sequences reach the learner through Ray, and a
checkpoint taken mid-run restores the workers' recurrent state."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowrl import Trainer

pytestmark = pytest.mark.usefixtures("ray_session")

CONFIG = {
    "num_workers": 1,
    "num_cpus_per_worker": 0.25,
    "num_envs_per_worker": 4,
    "rollout_fragment_length": 32,
    "train_batch_size": 128,
    "sgd_minibatch_size": 64,
    "num_sgd_iter": 2,
    "model": {"fcnet_hiddens": [16], "use_lstm": True, "lstm_cell_size": 16, "max_seq_len": 8},
    "seed": 0,
}


def test_lstm_ppo_trains_on_a_remote_worker_and_resumes_from_a_checkpoint(tmp_path: Path) -> None:
    trainer = Trainer("ppo", "StatelessCartPole-v1", CONFIG)
    try:
        for _ in range(2):
            result = trainer.train()
        assert result["timesteps_total"] == 256 and result["num_worker_restarts"] == 0
        fragment = trainer.workers.foreach_worker(lambda worker: worker.sample(), local=False)[0]
        assert fragment["seq_lens"].max() <= 8 and fragment["seq_lens"].sum() == fragment.count == 128
        path = trainer.save(str(tmp_path))
    finally:
        trainer.stop()
    restored = Trainer.from_checkpoint(path)
    try:
        assert restored.train()["timesteps_total"] == 384
    finally:
        restored.stop()
