"""Stop flags given with ``flowrl train --resume`` replace the run's criteria (tiny in-process PG runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import progress

from flowrl.cli import main as cli

pytestmark = pytest.mark.unit

TINY = ["--num-workers", "0", "--set", "train_batch_size=64", "--set", "rollout_fragment_length=32"]


def test_a_run_stopped_by_timesteps_continues_to_a_stop_iters_given_on_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["train", "--algo", "pg", "--env", "CartPole-v1", "--results-dir", str(tmp_path), "--name", "run", *TINY]
    assert cli.main([*argv, "--stop-timesteps", "64", "--checkpoint-freq", "1"]) == 0
    run = tmp_path / "run"
    assert [r["timesteps_total"] for r in progress(run)] == [64]
    capsys.readouterr()

    assert cli.main(["train", "--resume", str(run), "--stop-iters", "3", "--quiet"]) == 0
    assert "stopped: training_iteration 3 >= 3" in capsys.readouterr().out
    assert [r["training_iteration"] for r in progress(run)] == [1, 2, 3]
    assert json.loads((run / "params.json").read_text())["stop"] == {"training_iteration": 3}

    # No stop flag: the run keeps its criteria, which it meets.
    assert cli.main(["train", "--resume", str(run)]) == 0
    assert f"nothing to do: {run} already meets training_iteration 3 >= 3" in capsys.readouterr().out
