"""lr_schedule and entropy_coeff_schedule in running trainers: info/learner reports the values the learner
applied at the timesteps reached; a checkpoint keeps the schedule going at the same values; a live lr ends
it for good (restores included); a learner group and a learner thread apply and report the scheduled rate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import ray

from flowrl import Trainer
from flowrl.data import DEFAULT_POLICY_ID
from flowrl.policy.schedules import PiecewiseSchedule

pytestmark = pytest.mark.integration

LR = [[0, 1e-3], [256, 1e-4]]
ENTROPY = [[0, 0.02], [256, 0.0]]
PPO = {
    "num_workers": 0,
    "rollout_fragment_length": 64,
    "train_batch_size": 64,
    "sgd_minibatch_size": 32,
    "num_sgd_iter": 1,
    "model": {"fcnet_hiddens": [8]},
    "seed": 0,
    "lr_schedule": LR,
    "entropy_coeff_schedule": ENTROPY,
}


def learner_stats(result: dict[str, Any]) -> dict[str, float]:
    stats: dict[str, float] = result["info"]["learner"][DEFAULT_POLICY_ID]
    return stats


def test_ppo_reports_the_interpolated_rate_and_coefficient_at_each_timestep_reached() -> None:
    lr, entropy = PiecewiseSchedule(LR), PiecewiseSchedule(ENTROPY)
    with Trainer("ppo", "CartPole-v1", PPO) as trainer:
        for _ in range(5):
            result = trainer.train()
            t = result["timesteps_total"]
            stats = learner_stats(result)
            assert stats["cur_lr"] == pytest.approx(lr.value(t))
            assert stats["entropy_coeff"] == pytest.approx(entropy.value(t))
        policy = trainer.workers.local_worker().get_policy()
        assert policy.optimizer.param_groups[0]["lr"] == pytest.approx(1e-4)  # 320 steps: past the last point


def test_a_restored_run_goes_on_at_the_same_scheduled_values(tmp_path: Path) -> None:
    with Trainer("ppo", "CartPole-v1", PPO) as trainer:
        trainer.train()
        path = trainer.save(tmp_path)
        expected = [learner_stats(trainer.train()) for _ in range(2)]
    with Trainer.from_checkpoint(path) as restored:
        assert restored.config.lr_schedule == LR
        got = [learner_stats(restored.train()) for _ in range(2)]
    for key in ("cur_lr", "entropy_coeff"):
        assert [s[key] for s in got] == pytest.approx([s[key] for s in expected])
    assert expected[0]["cur_lr"] > expected[1]["cur_lr"]  # it kept scheduling


def test_a_live_lr_wins_over_the_schedule_from_then_on_also_after_a_restore(tmp_path: Path) -> None:
    with Trainer("ppo", "CartPole-v1", PPO) as trainer:
        trainer.train()
        trainer.update_config({"lr": 5e-4})
        assert trainer.config.lr_schedule is None and trainer.config.entropy_coeff_schedule == ENTROPY
        assert learner_stats(trainer.train())["cur_lr"] == pytest.approx(5e-4)
        path = trainer.save(tmp_path)
    with Trainer.from_checkpoint(path) as restored:
        for _ in range(2):
            stats = learner_stats(restored.train())
            assert stats["cur_lr"] == pytest.approx(5e-4)
        # The entropy coefficient, not overridden, keeps its schedule: 0 past 256 steps.
        assert stats["entropy_coeff"] == 0.0


@pytest.mark.usefixtures("ray_session")
@pytest.mark.timeout(180)
def test_a_learner_group_applies_and_reports_the_scheduled_rate() -> None:
    config = {**PPO, "num_learners": 2, "num_cpus_per_learner": 0.25}
    lr = PiecewiseSchedule(LR)
    with Trainer("ppo", "CartPole-v1", config) as trainer:
        learners = trainer.resources.learners
        assert learners is not None
        for _ in range(3):
            result = trainer.train()
            expected = lr.value(result["timesteps_total"])
            assert learner_stats(result)["cur_lr"] == pytest.approx(expected)
            states = ray.get([actor.learner_state.remote([DEFAULT_POLICY_ID]) for actor in learners.actors])
            for state in states:  # every replica's optimizer stepped at that rate
                assert state[DEFAULT_POLICY_ID][1]["param_groups"][0]["lr"] == pytest.approx(expected)


@pytest.mark.usefixtures("ray_session")
@pytest.mark.timeout(180)
def test_impalas_learner_thread_applies_and_reports_the_scheduled_rate() -> None:
    # Long enough that the first iteration ends well before the schedule does, even when a loaded machine
    # makes the asynchronous plan sample several times timesteps_per_iteration in it.
    schedule = [[0, 1e-3], [2000, 1e-4]]
    config = {
        "num_workers": 1,
        "num_cpus_per_worker": 0.1,
        "rollout_fragment_length": 10,
        "train_batch_size": 40,
        "timesteps_per_iteration": 200,
        "model": {"fcnet_hiddens": [8]},
        "seed": 0,
        "lr_schedule": schedule,
        "entropy_coeff_schedule": [[0, 0.01], [2000, 0.0]],
    }
    with Trainer("impala", "CartPole-v1", config) as trainer:
        reported = []
        for _ in range(40):
            result = trainer.train()
            stats = learner_stats(result)
            # The learner thread lags the sampling a little: its timestep is at most the steps sampled.
            assert PiecewiseSchedule(schedule).value(result["timesteps_total"]) <= stats["cur_lr"] <= 1e-3
            reported.append((stats["cur_lr"], stats["entropy_coeff"]))
            if result["timesteps_total"] >= 2400:
                break
        assert reported[-1][0] < reported[0][0] and reported[-1][0] < 3e-4
        assert reported[-1][1] < reported[0][1] <= 0.01
        policy = trainer.workers.local_worker().get_policy()
        assert policy.optimizer.param_groups[0]["lr"] <= reported[-1][0]  # what the thread applied since
