"""PBT's live lr on a trial with an lr_schedule: the first mutation ends the schedule, and later mutations stay
live changes while the trial's config (Tune's) still carries the schedule it started with."""

from __future__ import annotations

import pytest

from flowrl.tune.trainable import trainable_for

pytestmark = pytest.mark.unit

CONFIG = {
    "num_workers": 0,
    "rollout_fragment_length": 64,
    "train_batch_size": 64,
    "sgd_minibatch_size": 32,
    "model": {"fcnet_hiddens": [8]},
    "seed": 0,
    "lr_schedule": [[0, 1e-3], [1000, 1e-4]],
}


def test_pbts_mutated_lr_ends_the_schedule_and_stays_a_live_change() -> None:
    trial = trainable_for("ppo", "CartPole-v1")(config=CONFIG)
    try:
        trial.train()
        assert trial.reset({**CONFIG, "lr": 5e-4})
        assert trial.trainer.config.lr_schedule is None
        assert trial.reset({**CONFIG, "lr": 2e-4})  # Tune's config still holds the schedule
        assert trial._config_change == "live" and trial.trainer.config.lr_schedule is None
        assert trial.train()["info"]["learner"]["default_policy"]["cur_lr"] == pytest.approx(2e-4)
        assert trial.reset({**CONFIG, "lr": 2e-4, "lr_schedule": [[0, 1e-3]]})  # another schedule: a new trainer
        assert trial._config_change == "rebuilt" and trial.trainer.config.lr_schedule == [[0, 1e-3]]
    finally:
        trial.stop()
