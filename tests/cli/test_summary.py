"""What ``flowrl train`` prints when a run ends: ``checkpoints/best`` with its metric and value, and an offline
W&B run with the command that uploads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import progress

from flowrl.cli import main as cli
from flowrl.cli.summary import _report_summary
from flowrl.runs.run import RunSummary

pytestmark = pytest.mark.unit

TINY = ["--num-workers", "0", "--set", "train_batch_size=64", "--set", "rollout_fragment_length=32"]


def test_an_evaluating_run_names_its_best_checkpoint_and_evaluation_reward(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["train", "--algo", "pg", "--env", "CartPole-v1", "--results-dir", str(tmp_path), "--name", "run", *TINY]
    evaluating = ["--set", "evaluation_interval=1", "--set", "evaluation_num_episodes=2", "--seed", "0"]
    assert cli.main([*argv, *evaluating, "--stop-iters", "3", "--quiet"]) == 0
    run = tmp_path / "run"
    rewards = [(r["evaluation"]["episode_reward_mean"], r["training_iteration"]) for r in progress(run)]
    value, iteration = max(rewards, key=lambda pair: (pair[0], -pair[1]))  # the first iteration to reach the best
    expected = f"best checkpoint: {run / 'checkpoints' / 'best'} (evaluation/episode_reward_mean {value:.2f} "
    assert expected + f"at iteration {iteration})" in capsys.readouterr().out.splitlines()


def test_a_run_without_a_best_checkpoint_or_wandb_prints_neither(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _report_summary(RunSummary(tmp_path, "training_iteration 1 >= 1", 10.0, 1, tmp_path / "checkpoints" / "c"))
    printed = capsys.readouterr().out
    assert "best checkpoint" not in printed and "W&B" not in printed and "wandb" not in printed


def test_an_offline_wandb_run_is_named_with_the_sync_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "my run"
    (run / "wandb" / "offline-run-20250101_000000-abc123").mkdir(parents=True)
    (run / "wandb" / "offline-run-20250102_000000-abc123").mkdir()  # the session of a resume
    (run / "wandb" / "offline-run-20250101_000000-other9").mkdir()  # another W&B run's
    (run / "trackers.json").write_text(json.dumps({"wandb": {"project": "p", "run_id": "abc123"}}))
    _report_summary(RunSummary(run, "training_iteration 1 >= 1", 10.0, 1, run / "checkpoints" / "checkpoint_000001"))
    lines = capsys.readouterr().out.splitlines()
    first, second = (f"'{run / 'wandb' / f'offline-run-2025010{day}_000000-abc123'}'" for day in (1, 2))
    assert f"W&B offline run: {run / 'wandb' / 'offline-run-20250102_000000-abc123'}" in lines
    assert f"upload it with: wandb sync {first} {second}" in lines
