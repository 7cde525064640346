"""R2D2 on Ape-X's plan: remote workers store sequences into a replay shard, the learner thread learns
from them, and a checkpoint restores the run with its replayed sequences; on DQN's plan, evaluation
threads the state through greedy episodes and load_policy acts as the trained policy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray

import flowrl
from flowrl import Trainer
from flowrl.data import SampleBatch
from flowrl.policy.recurrent_q_policy import RecurrentQPolicy

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


def test_r2d2_evaluates_greedily_with_its_state_threaded_and_loads_as_an_inference_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[list[np.ndarray], list[np.ndarray]]] = []  # (state in, state out) of each greedy step
    compute_actions = RecurrentQPolicy.compute_actions

    def recording(self: RecurrentQPolicy, obs: Any, *args: Any, **kwargs: Any) -> Any:
        actions, extra = compute_actions(self, obs, *args, **kwargs)
        if not kwargs.get("explore", True):
            calls.append(([s.copy() for s in kwargs["state"]], [extra[f"state_out_{k}"] for k in range(2)]))
        return actions, extra

    monkeypatch.setattr(RecurrentQPolicy, "compute_actions", recording)
    config = {**CONFIG, "num_workers": 0, "evaluation_interval": 1, "evaluation_num_episodes": 2}
    with Trainer("r2d2", "StatelessCartPole-v1", config) as trainer:
        for _ in range(2):
            result = trainer.train()
        evaluation = result["evaluation"]
        assert evaluation["episodes"] == 2 and evaluation["episode_len_mean"] > 0
        policy = trainer.workers.local_worker().get_policy()
        trainer.save(tmp_path)
    # Every evaluation episode starts from zeros and every other step from the state the step before returned.
    starts = [k for k, (state_in, _) in enumerate(calls) if all(not s.any() for s in state_in)]
    assert len(calls) >= 4 * evaluation["episode_len_mean"] and len(starts) == 4  # 2 episodes, 2 evaluations
    for k in range(1, len(calls)):
        if k not in starts:
            for entry_in, entry_out in zip(calls[k][0], calls[k - 1][1]):
                np.testing.assert_array_equal(entry_in, entry_out)
    loaded = flowrl.load_policy(tmp_path)  # the run directory: its latest checkpoint
    assert loaded.is_recurrent and loaded.algo == "r2d2"
    obs = np.asarray([0.02, -0.03], np.float32)
    state = loaded.get_initial_state()
    for _ in range(5):
        action, next_state = loaded.compute_action(obs, state)
        expected, extra = compute_actions(policy, obs[None], explore=False, state=[s[None] for s in state])
        assert action == expected[0]
        np.testing.assert_allclose(next_state[0], extra["state_out_0"][0], rtol=1e-6)
        state = next_state
