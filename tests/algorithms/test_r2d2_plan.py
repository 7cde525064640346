"""R2D2 on Ape-X's plan: remote workers store sequences into a replay shard, the learner thread learns
from them, and a checkpoint restores the run with its replayed sequences."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import ray

from flowrl import Trainer
from flowrl.data import SampleBatch

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(240)]

CONFIG = {
    "seed": 0,
    "num_workers": 2,
    "num_replay_shards": 1,
    "num_cpus_per_worker": 0.1,
    "replay_sequence_length": 8,
    "replay_burn_in": 2,
    "rollout_fragment_length": 16,
    "train_batch_size": 64,
    "learning_starts": 64,
    "timesteps_per_iteration": 200,
    "buffer_size": 1000,
    "model": {"fcnet_hiddens": [16], "lstm_cell_size": 16},
}


def test_r2d2_learns_from_replayed_sequences_on_remote_workers_and_restores(tmp_path: Path) -> None:
    with Trainer("r2d2", "StatelessCartPole-v1", CONFIG) as trainer:
        for _ in range(3):
            result = trainer.train()
        assert result["info"]["num_steps_trained"] > 0
        shard = trainer.resources.need_replay_actors()[0]
        replayed = ray.get(shard.replay.remote(), timeout=60)
        assert replayed is not None and len(replayed[SampleBatch.SEQ_LENS]) == 64 // 8
        assert max(replayed[SampleBatch.SEQ_LENS]) <= 8 and replayed["state_in_0"].shape == (8, 16)
        assert not np.allclose(replayed["state_in_0"], 0), "sequences start from the state the workers acted from"
        path = trainer.save(tmp_path)
        saved = ray.get(shard.stats.remote(), timeout=60)
        iteration = trainer.iteration
    with Trainer.from_checkpoint(path) as restored:
        assert restored.iteration == iteration
        shard = restored.resources.need_replay_actors()[0]
        # The learner thread runs on after an iteration: the shard was saved at or before the stats read after.
        stats = ray.get(shard.stats.remote(), timeout=60)["policies"]["default_policy"]
        assert 0 < stats["num_entries"] <= saved["policies"]["default_policy"]["num_entries"]
        again = ray.get(shard.replay.remote(), timeout=60)
        assert again is not None and again["state_in_0"].shape == (8, 16), "the restored shard replays sequences"
        assert restored.train()["info"]["num_steps_trained"] > 0


def test_r2d2_with_no_workers_runs_dqns_plan_in_one_process() -> None:
    config = {**CONFIG, "num_workers": 0, "num_envs_per_worker": 2}
    with Trainer("r2d2", "StatelessCartPole-v1", config) as trainer:
        result = trainer.train()
        assert result["info"]["num_steps_trained"] > 0
        assert trainer.resources.need_replay_buffer().replay_sequence_length == 8
