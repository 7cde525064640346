"""LSTM-PPO with two policies on a multi-agent env: each policy learns from its agents' sequences, and
evaluation plays each agent from its own state."""

from __future__ import annotations

import numpy as np
import pytest

from flowrl import Trainer
from flowrl.data import SampleBatch

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(300)]


def by_parity(agent: int) -> str:
    return "even" if agent % 2 == 0 else "odd"


def test_lstm_ppo_trains_and_evaluates_two_recurrent_policies() -> None:
    trainer = Trainer(
        "ppo",
        "MultiAgentCartPole",
        {
            "num_workers": 0,
            "seed": 0,
            "env_config": {"num_agents": 2},
            "policies": {"even": None, "odd": None},
            "policy_mapping_fn": by_parity,
            "train_batch_size": 256,
            "rollout_fragment_length": 64,
            "sgd_minibatch_size": 64,
            "num_sgd_iter": 2,
            "evaluation_interval": 1,
            "evaluation_num_episodes": 2,
            "model": {"use_lstm": True, "lstm_cell_size": 8, "fcnet_hiddens": [16], "max_seq_len": 8},
        },
    )
    try:
        for _ in range(2):
            result = trainer.train()
        learner = result["info"]["learner"]
        assert set(learner) == {"even", "odd"} and all(np.isfinite(stats["policy_loss"]) for stats in learner.values())
        assert result["evaluation"]["episodes"] == 2 and set(result["evaluation"]["policy_reward_mean"]) == {
            "even",
            "odd",
        }
        fragment = trainer.workers.local_worker().sample()
        for pid, batch in fragment.policy_batches.items():
            seq_lens = batch[SampleBatch.SEQ_LENS]
            assert seq_lens.max() <= 8 and seq_lens.sum() == batch.count, pid
            assert len(batch[f"{SampleBatch.STATE_IN}0"]) == len(seq_lens)
            assert set(np.unique(batch[SampleBatch.AGENT_INDEX])) == {0 if pid == "even" else 1}
    finally:
        trainer.stop()
