"""A run that reaches its restart cap leaves an emergency checkpoint, and resuming it may raise the cap."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import ray
from fakes import checkpoints, is_dead, progress

from flowrl.actors import ReplayShards
from flowrl.cli.train import resume_conflicts
from flowrl.errors import ConfigError, WorkerFailureError
from flowrl.runs.resume import find_resume_point, resume_run
from flowrl.runs.run import Run, start_run
from flowrl.storage.checkpoints import read_checkpoint
from flowrl.storage.rundir import RunSpec, read_run_spec

pytestmark = pytest.mark.unit

# One remote worker on a quarter of a CPU, one small SGD batch per iteration.
ONE_WORKER_PPO = {
    "num_workers": 1,
    "num_cpus_per_worker": 0.25,
    "num_envs_per_worker": 1,
    "rollout_fragment_length": 32,
    "train_batch_size": 32,
    "sgd_minibatch_size": 32,
    "num_sgd_iter": 1,
    "seed": 0,
}


def kill_the_worker_after(iteration: int, run: Run) -> Callable[[dict[str, Any]], None]:
    """An ``on_result`` that kills the run's remote worker once ``iteration`` has finished."""

    def on_result(result: dict[str, Any]) -> None:
        if result["training_iteration"] == iteration:
            [worker] = run.trainer.workers.remote_workers()
            ray.kill(worker, no_restart=True)
            assert is_dead(worker)

    return on_result


@pytest.mark.timeout(300)
def test_a_run_at_its_restart_cap_saves_and_resumes_with_a_higher_cap(tmp_path: Path, ray_session: None) -> None:
    spec = RunSpec("ppo", "CartPole-v1", {**ONE_WORKER_PPO, "max_worker_restarts": 0}, stop={"training_iteration": 5})
    with start_run(spec, results_dir=tmp_path) as run:
        with pytest.raises(WorkerFailureError, match="max_worker_restarts=0") as info:
            run.train(on_result=kill_the_worker_after(2, run))
    assert info.value.worker_indices == [1]
    assert run.failure is not None and run.failure.saved, run.failure
    assert run.failure.error is info.value
    assert checkpoints(run.directory) == ["checkpoint_000002"]
    assert run.trainer.workers.num_worker_restarts == 0  # saving met the dead worker and restarted nothing

    # As `flowrl train --resume RUN_DIR --set max_worker_restarts=10` does.
    point = find_resume_point(run.directory, config={"max_worker_restarts": 10})
    assert point.iteration == 2 and point.spec.config["max_worker_restarts"] == 10
    with resume_run(point) as resumed:
        assert resumed.trainer.workers.restart_budget.max_restarts == 10
        summary = resumed.train(on_result=kill_the_worker_after(3, resumed))
    assert summary.stop_reason == "training_iteration 5 >= 5"
    results = progress(run.directory)
    assert [r["training_iteration"] for r in results] == [1, 2, 3, 4, 5]
    assert results[-1]["num_worker_restarts"] == 1 and results[-1]["num_healthy_workers"] == 1
    assert read_run_spec(run.directory).config["max_worker_restarts"] == 10  # params.json says the new cap


def test_only_the_restart_budget_may_change_on_resume(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match="lr cannot change on resume: .* but for max_worker_restarts, restart_window_s"
    ):
        find_resume_point(tmp_path, config={"lr": 0.1, "max_worker_restarts": 10})
    spec = RunSpec("ppo", "CartPole-v1", {"seed": 0})

    def flags(*assignments: str) -> argparse.Namespace:
        return argparse.Namespace(config=None, set=list(assignments), results_dir=None, algo=None, env=None, seed=None)

    params = tmp_path / "params.json"
    assert resume_conflicts(flags("max_worker_restarts=10", "restart_window_s=60"), spec, params) == []
    [conflict] = resume_conflicts(flags("max_worker_restarts=10", "lr=0.1"), spec, params)
    assert conflict.startswith("--set cannot be used with --resume")
    assert "--set max_worker_restarts/restart_window_s" in conflict


# One remote worker and one replay shard, training from the second iteration on.
SMALL_APEX = {
    "num_workers": 1,
    "num_cpus_per_worker": 0.25,
    "num_envs_per_worker": 1,
    "rollout_fragment_length": 20,
    "learning_starts": 100,
    "train_batch_size": 16,
    "timesteps_per_iteration": 200,
    "seed": 0,
}


@pytest.mark.timeout(300)
def test_a_replay_shard_past_its_cap_still_leaves_an_emergency_checkpoint(tmp_path: Path, ray_session: None) -> None:
    spec = RunSpec("apex", "CartPole-v1", {**SMALL_APEX, "max_worker_restarts": 0}, stop={"training_iteration": 6})

    def kill_the_shard_after_2(result: dict[str, Any]) -> None:
        if result["training_iteration"] == 2:
            [shard] = run.trainer.resources.replay_actors
            ray.kill(shard, no_restart=True)
            assert is_dead(shard)

    with start_run(spec, results_dir=tmp_path) as run:
        with pytest.raises(WorkerFailureError, match="replay shard"):
            run.train(on_result=kill_the_shard_after_2)
    assert run.failure is not None and run.failure.saved, run.failure
    assert checkpoints(run.directory)[-1] == f"checkpoint_{run.trainer.iteration:06d}"
    checkpoint_path = run.directory / "checkpoints" / checkpoints(run.directory)[-1]

    state, _ = read_checkpoint(checkpoint_path)  # the dead shard's rows are left out: on restore it starts empty
    assert state["resources"]["replay_shards"] == [None]

    # The shard restored empty must be refilled before it replays: sampling is not held back
    # by Ape-X's throttle meanwhile (it was, and the resumed run waited for ever about half the time).
    trained_at_save = state["plan"]["metrics"][0]["num_steps_trained"]
    point = find_resume_point(run.directory, config={"max_worker_restarts": 10})
    with resume_run(point) as resumed:
        shards = resumed.trainer.resources.replay_actors
        assert isinstance(shards, ReplayShards) and shards.refill_steps == SMALL_APEX["learning_starts"]
        resumed.train()
    assert resumed.trainer.iteration == 6
    assert progress(run.directory)[-1]["info"]["num_steps_trained"] > trained_at_save
