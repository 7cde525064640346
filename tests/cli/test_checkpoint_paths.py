"""What ``flowrl evaluate``, ``flowrl export`` and ``load_policy`` accept as a checkpoint path: a checkpoint
directory, a run directory, and the trial directory ``flowrl tune`` reports as best (Tune's
``<trial>/checkpoint_<index>/`` holding flowrl's ``checkpoint_<iteration>``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from policy_files import build_policies

import flowrl
from flowrl.cli.main import main
from flowrl.errors import CheckpointError
from flowrl.serve.inference import checkpoint_dir, policy_files
from flowrl.storage.checkpoints import write_checkpoint

pytestmark = [pytest.mark.unit, pytest.mark.timeout(180)]

#: The trial's episode_reward_mean at iterations 1, 2 and 3: iteration 2 is its best.
REWARDS = {1: 10.0, 2: 50.0, 3: 20.0}


def tune_trial(experiment: Path, *, metric: str | None = "episode_reward_mean", mode: str = "max") -> Path:
    """A trial directory as ``flowrl tune`` leaves it: one Tune checkpoint per iteration, each holding a flowrl one."""
    experiment.mkdir(parents=True)
    if metric is not None:
        spec = {"algo": "ppo", "env": "CartPole-v1", "metric": metric, "mode": mode, "searched": []}
        (experiment / "spec.json").write_text(json.dumps(spec))
    trial = experiment / "ppo_CartPole-v1_00000_a1b2c3"
    trial.mkdir()
    (trial / "params.json").write_text(json.dumps({"algo": "ppo", "env": "CartPole-v1", "config": {}}))
    lines = [json.dumps({"training_iteration": i, "episode_reward_mean": reward}) for i, reward in REWARDS.items()]
    (trial / "progress.jsonl").write_text("\n".join(lines) + "\n")
    for index, iteration in enumerate(REWARDS):
        policy_map, config = build_policies("ppo", "CartPole-v1", seed=iteration)
        metadata = {"algo": "ppo", "env": "CartPole-v1", "iteration": iteration, "config": {"env_config": {}}}
        write_checkpoint(
            trial / f"checkpoint_{index:06d}" / f"checkpoint_{iteration:06d}",
            {},
            metadata,
            policy_files(policy_map, "ppo", config),
        )
    return trial


def test_a_tune_trial_directory_gives_its_best_checkpoint_by_the_experiments_metric(tmp_path: Path) -> None:
    trial = tune_trial(tmp_path / "exp")
    best = trial / "checkpoint_000001" / "checkpoint_000002"
    assert checkpoint_dir(trial) == best
    assert checkpoint_dir(trial, checkpoint=3) == trial / "checkpoint_000002" / "checkpoint_000003"
    with pytest.raises(CheckpointError, match=r"has no complete checkpoint 7; its checkpoints are \[1, 2, 3\]"):
        checkpoint_dir(trial, checkpoint=7)
    assert flowrl.load_policy(trial).compute_action([0.0, 0.0, 0.0, 0.0]) in (0, 1)

    minimized = tune_trial(tmp_path / "exp_min", mode="min")
    assert checkpoint_dir(minimized) == minimized / "checkpoint_000000" / "checkpoint_000001"


def test_a_tune_trial_without_a_recorded_metric_gives_its_latest_checkpoint(tmp_path: Path) -> None:
    trial = tune_trial(tmp_path / "exp", metric=None)
    assert checkpoint_dir(trial) == trial / "checkpoint_000002" / "checkpoint_000003"
    unscored = tune_trial(tmp_path / "exp_other", metric="evaluation/episode_reward_mean")  # in no result
    assert checkpoint_dir(unscored) == unscored / "checkpoint_000002" / "checkpoint_000003"


def test_flowrl_evaluate_and_export_take_the_best_trial_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trial = tune_trial(tmp_path / "exp")
    best = trial / "checkpoint_000001" / "checkpoint_000002"
    assert main(["evaluate", str(trial), "--episodes", "1", "--seed", "0"]) == 0
    assert f"checkpoint: {best} (ppo on CartPole-v1, iteration 2)" in capsys.readouterr().out

    assert main(["export", str(trial), "--format", "torchscript"]) == 0
    assert f"model: {trial / 'exports' / 'checkpoint_000002' / 'default_policy.pt'}" in capsys.readouterr().out
    assert main(["export", str(trial), "--checkpoint", "1", "--format", "torchscript"]) == 0
    assert (trial / "exports" / "checkpoint_000001" / "default_policy.pt").is_file()


def test_a_directory_with_no_checkpoint_names_what_would_do(tmp_path: Path) -> None:
    empty = tmp_path / "trial"
    (empty / "checkpoint_000000").mkdir(parents=True)  # a Tune checkpoint whose flowrl checkpoint never completed
    with pytest.raises(CheckpointError, match="a run directory with a checkpoints/ folder or a Tune trial directory"):
        checkpoint_dir(empty)
