"""flowrl.run as a Python user calls it: run directories, stop criteria, checkpoint cadence, resuming."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from flowrl.errors import CheckpointError, ConfigError, RunError
from flowrl.run import (
    RunSpec,
    find_resume_point,
    parse_stop,
    read_run_spec,
    resume_run,
    start_run,
    stop_reason,
)

from fakes import checkpoints, progress

# One process, two tiny SGD batches per iteration: each training iteration takes milliseconds.
TINY = {"num_workers": 0, "train_batch_size": 64, "rollout_fragment_length": 32, "seed": 0}


# --- stop criteria (no Ray) --------------------------------------------------------------------------


def test_stop_reason_names_the_first_criterion_met() -> None:
    stop = {"episode_reward_mean": 100, "timesteps_total": 1000}
    assert stop_reason(stop, {"episode_reward_mean": 50.0, "timesteps_total": 999}) is None
    assert stop_reason(stop, {"episode_reward_mean": 50.0, "timesteps_total": 1200}) == "timesteps_total 1200 >= 1000"
    assert stop_reason(stop, {"episode_reward_mean": 100.5, "timesteps_total": 1200}) == "episode_reward_mean 100.5 >= 100"
    # No finished episode yet (NaN reward), a missing key, or a bool are never a reason to stop.
    assert stop_reason({"episode_reward_mean": -math.inf}, {"episode_reward_mean": math.nan}) is None
    assert stop_reason({"training_iteration": 1}, {}) is None
    assert stop_reason({"training_iteration": 1}, {"training_iteration": True}) is None
    assert stop_reason({}, {"training_iteration": 10**6}) is None


def test_stop_criteria_are_checked() -> None:
    assert parse_stop({"training_iteration": 3}, "here") == {"training_iteration": 3}
    with pytest.raises(RunError, match="here: unknown stop criterion 'training_iterations'; did you mean 'training_iteration'"):
        parse_stop({"training_iterations": 3}, "here")
    with pytest.raises(RunError, match="must be a number"):
        RunSpec("pg", "CartPole-v1", stop={"timesteps_total": "1e6"})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match="checkpoint_freq=-1 must be an integer >= 0"):
        RunSpec("pg", "CartPole-v1", checkpoint_freq=-1)


def test_a_spec_is_not_changed_by_its_callers_dicts() -> None:
    config, stop = {"lr": 0.1}, {"training_iteration": 2}
    spec = RunSpec("pg", "CartPole-v1", config, stop)
    config["lr"], stop["training_iteration"] = 0.2, 5
    assert spec.to_params() == {"algo": "pg", "env": "CartPole-v1", "config": {"lr": 0.1},
                                "stop": {"training_iteration": 2}, "checkpoint_freq": 0}


# --- a new run -----------------------------------------------------------------------------------------


def test_a_run_writes_params_progress_and_the_final_checkpoint(tmp_path: Path, ray_session: None) -> None:
    seen: list[dict[str, Any]] = []
    spec = RunSpec("PG", "CartPole-v1", TINY, stop={"training_iteration": 3})
    with start_run(spec, results_dir=tmp_path) as run:
        assert run.directory.parent == tmp_path and run.directory.name.startswith("pg_CartPole-v1_")
        summary = run.train(on_result=seen.append)
    params = json.loads((run.directory / "params.json").read_text())
    assert params == run.spec.to_params()
    assert params["algo"] == "pg" and params["stop"] == {"training_iteration": 3} and params["checkpoint_freq"] == 0
    assert params["config"]["train_batch_size"] == 64 and "lr" in params["config"]  # every key, defaults included
    results = progress(run.directory)
    assert [r["training_iteration"] for r in results] == [r["training_iteration"] for r in seen] == [1, 2, 3]
    assert [r["timesteps_total"] for r in results] == [64, 128, 192]
    assert checkpoints(run.directory) == ["checkpoint_000003"]  # checkpoint_freq 0: only the final one
    assert summary.stop_reason == "training_iteration 3 >= 3" and not summary.interrupted and not summary.save_interrupted
    assert summary.directory == run.directory
    assert summary.checkpoint == run.checkpoint == run.directory / "checkpoints" / "checkpoint_000003"
    rewards = [(r["episode_reward_mean"], r["training_iteration"]) for r in results if r["episode_reward_mean"] is not None]
    assert (summary.best_reward, summary.best_iteration) == max(rewards, key=lambda pair: pair[0])


def test_checkpoints_every_n_iterations_and_at_the_end(tmp_path: Path, ray_session: None) -> None:
    spec = RunSpec("pg", "CartPole-v1", TINY, stop={"timesteps_total": 300}, checkpoint_freq=2)
    with start_run(spec, results_dir=tmp_path) as run:
        summary = run.train()
    assert summary.stop_reason == "timesteps_total 320 >= 300"
    assert checkpoints(run.directory) == ["checkpoint_000002", "checkpoint_000004", "checkpoint_000005"]


def test_ctrl_c_ends_training_with_a_checkpoint(tmp_path: Path, ray_session: None) -> None:
    with start_run(RunSpec("pg", "CartPole-v1", TINY, stop={"training_iteration": 5}), results_dir=tmp_path) as run:
        real_train = run.trainer.train

        def train_until_interrupted() -> dict[str, Any]:
            if run.trainer.iteration == 2:
                raise KeyboardInterrupt
            return real_train()

        run.trainer.train = train_until_interrupted  # type: ignore[method-assign]
        summary = run.train()
    assert summary.interrupted and summary.stop_reason is None and not summary.save_interrupted
    assert summary.checkpoint == run.directory / "checkpoints" / "checkpoint_000002"
    assert len(progress(run.directory)) == 2


def test_a_rejected_config_leaves_no_run_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'lrr'; did you mean 'lr'"):
        start_run(RunSpec("pg", "CartPole-v1", {"lrr": 0.1}), results_dir=tmp_path)
    assert not any(tmp_path.iterdir())


# --- resuming ------------------------------------------------------------------------------------------


def test_resume_drops_the_results_after_the_checkpoint(tmp_path: Path, ray_session: None) -> None:
    spec = RunSpec("pg", "CartPole-v1", TINY, stop={"training_iteration": 2}, checkpoint_freq=1)
    with start_run(spec, results_dir=tmp_path) as run:
        run.train()
    run_dir = run.directory
    shutil.rmtree(run_dir / "checkpoints" / "checkpoint_000002")  # as if the run died before saving it
    with open(run_dir / "progress.jsonl", "a") as f:
        f.write('{"training_iteration": 3, "timest')  # and mid-line

    point = find_resume_point(run_dir, stop={"training_iteration": 4})
    assert point.checkpoint == run_dir / "checkpoints" / "checkpoint_000001"
    assert (point.iteration, point.timesteps_total) == (1, 64)
    assert [r["training_iteration"] for r in point.results] == [1] and point.drops_results
    assert point.stop_reason is None
    assert point.spec.stop == {"training_iteration": 4} and point.spec.checkpoint_freq == 1
    assert (run_dir / "progress.jsonl").read_text().endswith('"timest')  # finding the point changes nothing

    with resume_run(point) as resumed:
        assert resumed.trainer.iteration == 1 and resumed.timesteps_total == 64
        assert [r["training_iteration"] for r in progress(run_dir)] == [1]
        summary = resumed.train()
    assert summary.stop_reason == "training_iteration 4 >= 4"
    assert [r["training_iteration"] for r in progress(run_dir)] == [1, 2, 3, 4]
    assert [r["timesteps_total"] for r in progress(run_dir)] == [64, 128, 192, 256]
    assert checkpoints(run_dir) == ["checkpoint_000001", "checkpoint_000002", "checkpoint_000003", "checkpoint_000004"]
    assert read_run_spec(run_dir).stop == {"training_iteration": 4}


def test_resume_knows_when_there_is_nothing_to_do(tmp_path: Path, ray_session: None) -> None:
    with start_run(RunSpec("pg", "CartPole-v1", TINY, stop={"training_iteration": 1}), results_dir=tmp_path) as run:
        run.train()
    point = find_resume_point(run.directory)
    assert point.stop_reason == "training_iteration 1 >= 1" and not point.drops_results
    # New criteria replace the run's own key by key; the others stay.
    point = find_resume_point(run.directory, stop={"timesteps_total": 1000}, checkpoint_freq=5)
    assert point.spec.stop == {"training_iteration": 1, "timesteps_total": 1000} and point.spec.checkpoint_freq == 5
    assert point.stop_reason == "training_iteration 1 >= 1"


def test_resume_needs_a_run_directory_with_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(RunError, match="no such directory"):
        find_resume_point(tmp_path / "nowhere")
    with pytest.raises(RunError, match="no params.json"):
        find_resume_point(tmp_path)
    (tmp_path / "params.json").write_text(json.dumps({"algo": "pg", "env": "CartPole-v1", "config": {}}))
    assert read_run_spec(tmp_path) == RunSpec("pg", "CartPole-v1")
    with pytest.raises(CheckpointError, match="no checkpoint under"):
        find_resume_point(tmp_path)
