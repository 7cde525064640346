"""flowrl.runs.run and flowrl.runs.resume as a Python user calls them: run directories, stop criteria,
checkpoint cadence, resuming."""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import re
import shutil
import signal
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from fakes import checkpoints, progress

from flowrl.errors import CheckpointError, ConfigError, RunError, RunWarning, WorkerFailureError
from flowrl.runs.resume import find_resume_point, resume_run
from flowrl.runs.run import Run, start_run
from flowrl.storage.rundir import RunSpec, find_run_dir, parse_stop, read_run_spec, stop_reason
from flowrl.storage.shared import StorageWarning, check_storage_path

pytestmark = pytest.mark.unit

# One process, two tiny SGD batches per iteration: each training iteration takes milliseconds.
TINY = {"num_workers": 0, "train_batch_size": 64, "rollout_fragment_length": 32, "seed": 0}


# --- stop criteria (no Ray) --------------------------------------------------------------------------


def test_stop_reason_names_the_first_criterion_met() -> None:
    stop = {"episode_reward_mean": 100, "timesteps_total": 1000}
    assert stop_reason(stop, {"episode_reward_mean": 50.0, "timesteps_total": 999}) is None
    assert stop_reason(stop, {"episode_reward_mean": 50.0, "timesteps_total": 1200}) == "timesteps_total 1200 >= 1000"
    assert (
        stop_reason(stop, {"episode_reward_mean": 100.5, "timesteps_total": 1200}) == "episode_reward_mean 100.5 >= 100"
    )
    # No finished episode yet (NaN reward), a missing key, or a bool are never a reason to stop.
    assert stop_reason({"episode_reward_mean": -math.inf}, {"episode_reward_mean": math.nan}) is None
    assert stop_reason({"training_iteration": 1}, {}) is None
    assert stop_reason({"training_iteration": 1}, {"training_iteration": True}) is None
    assert stop_reason({}, {"training_iteration": 10**6}) is None


def test_stop_criteria_are_checked() -> None:
    assert parse_stop({"training_iteration": 3}, "here") == {"training_iteration": 3}
    with pytest.raises(
        RunError, match="here: unknown stop criterion 'training_iterations'; did you mean 'training_iteration'"
    ):
        parse_stop({"training_iterations": 3}, "here")
    with pytest.raises(RunError, match="must be a number"):
        RunSpec("pg", "CartPole-v1", stop=cast(Any, {"timesteps_total": "1e6"}))
    with pytest.raises(ConfigError, match="checkpoint_freq=-1 must be an integer >= 0"):
        RunSpec("pg", "CartPole-v1", checkpoint_freq=-1)


def test_checkpoint_settings_are_checked_all_at_once() -> None:
    with pytest.raises(ConfigError) as error:
        RunSpec("pg", "CartPole-v1", checkpoint_interval_s=-1, keep_checkpoints=0, keep_best="")
    assert [p.split(" must")[0] for p in error.value.problems] == [
        "checkpoint_interval_s=-1",
        "keep_checkpoints=0",
        "keep_best=''",
    ]
    with pytest.raises(ConfigError, match="checkpoint_interval_s=inf must be a finite number of seconds >= 0"):
        RunSpec("pg", "CartPole-v1", checkpoint_interval_s=math.inf)
    assert RunSpec("pg", "CartPole-v1", checkpoint_interval_s=0, keep_best="score").checkpoint_interval_s == 0.0


def test_params_json_records_the_checkpoint_settings_and_older_files_get_the_defaults(tmp_path: Path) -> None:
    spec = RunSpec(
        "pg", "CartPole-v1", checkpoint_freq=2, checkpoint_interval_s=30, keep_checkpoints=2, keep_best="score"
    )
    (tmp_path / "params.json").write_text(json.dumps(spec.to_params()))
    assert read_run_spec(tmp_path) == spec
    # A params.json written before these settings existed: the defaults apply.
    (tmp_path / "params.json").write_text(
        json.dumps({"algo": "pg", "env": "CartPole-v1", "config": {}, "checkpoint_freq": 3})
    )
    old = read_run_spec(tmp_path)
    assert (old.checkpoint_freq, old.checkpoint_interval_s, old.keep_checkpoints, old.keep_best) == (3, 600.0, 5, None)
    (tmp_path / "params.json").write_text(
        json.dumps({"algo": "pg", "env": "CartPole-v1", "config": {}, "keep_checkpoints": 0})
    )
    with pytest.raises(RunError, match="params.json: keep_checkpoints=0 must be an integer >= 1"):
        read_run_spec(tmp_path)


def test_a_spec_is_not_changed_by_its_callers_dicts() -> None:
    config, stop = {"lr": 0.1}, {"training_iteration": 2}
    spec = RunSpec("pg", "CartPole-v1", config, stop)
    config["lr"], stop["training_iteration"] = 0.2, 5
    assert spec.to_params() == {
        "algo": "pg",
        "env": "CartPole-v1",
        "config": {"lr": 0.1},
        "stop": {"training_iteration": 2},
        "checkpoint_freq": 0,
        "checkpoint_interval_s": 600.0,
        "keep_checkpoints": 5,
        "keep_best": None,
    }


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
    assert (
        summary.stop_reason == "training_iteration 3 >= 3" and not summary.interrupted and not summary.save_interrupted
    )
    assert summary.directory == run.directory
    assert summary.checkpoint == run.checkpoint == run.directory / "checkpoints" / "checkpoint_000003"
    rewards = [
        (r["episode_reward_mean"], r["training_iteration"]) for r in results if r["episode_reward_mean"] is not None
    ]
    assert (summary.best_reward, summary.best_iteration) == max(rewards, key=lambda pair: pair[0])


def test_checkpoints_every_n_iterations_and_at_the_end(tmp_path: Path, ray_session: None) -> None:
    spec = RunSpec("pg", "CartPole-v1", TINY, stop={"timesteps_total": 300}, checkpoint_freq=2)
    with start_run(spec, results_dir=tmp_path) as run:
        summary = run.train()
    assert summary.stop_reason == "timesteps_total 320 >= 300"
    assert checkpoints(run.directory) == ["checkpoint_000002", "checkpoint_000004", "checkpoint_000005"]


def test_ctrl_c_ends_training_with_a_checkpoint(
    tmp_path: Path, ray_session: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with start_run(RunSpec("pg", "CartPole-v1", TINY, stop={"training_iteration": 5}), results_dir=tmp_path) as run:
        real_train = run.trainer.train

        def train_until_interrupted() -> dict[str, Any]:
            if run.trainer.iteration == 2:
                raise KeyboardInterrupt
            return real_train()

        monkeypatch.setattr(run.trainer, "train", train_until_interrupted)
        summary = run.train()
    assert summary.interrupted and summary.stop_reason is None and not summary.save_interrupted
    assert summary.checkpoint == run.directory / "checkpoints" / "checkpoint_000002"
    assert len(progress(run.directory)) == 2


def replace_train(run: Run, fn: Callable[[Callable[[], dict[str, Any]], int], dict[str, Any]]) -> None:
    """Make ``run.trainer.train`` call ``fn(real_train, call_number)`` (call numbers start at 1)."""
    real_train = run.trainer.train
    calls = [0]

    def train() -> dict[str, Any]:
        calls[0] += 1
        return fn(real_train, calls[0])

    setattr(run.trainer, "train", train)


def with_scores(scores: list[float]) -> Callable[[Callable[[], dict[str, Any]], int], dict[str, Any]]:
    """A ``replace_train`` function adding ``score`` = the next of ``scores`` to each result."""

    def train(real_train: Callable[[], dict[str, Any]], call: int) -> dict[str, Any]:
        return {**real_train(), "score": scores[call - 1]}

    return train


def test_rotation_keeps_the_newest_checkpoints_and_a_failed_save_deletes_nothing(
    tmp_path: Path, ray_session: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = RunSpec("pg", "CartPole-v1", TINY, stop={"training_iteration": 6}, checkpoint_freq=1, keep_checkpoints=3)
    with start_run(spec, results_dir=tmp_path) as run:
        real_save = run.trainer.save
        saves: list[int] = []

        def save(checkpoint_dir: Any, metadata: Any = None) -> str:
            saves.append(run.trainer.iteration)
            if len(saves) >= 6:  # the disk is full from the 6th save on
                raise OSError(28, "No space left on device")
            return real_save(checkpoint_dir, metadata)

        monkeypatch.setattr(run.trainer, "save", save)
        # The periodic save of iteration 6 is a warning (tests/runs/test_failed_saves.py); the final save's
        # failure ends the run, and is not tried again as an emergency save.
        with pytest.warns(RunWarning, match="num_failed_checkpoints=1"), pytest.raises(OSError, match="No space left"):
            run.train()
    assert saves == [1, 2, 3, 4, 5, 6, 6]
    assert checkpoints(run.directory) == ["checkpoint_000003", "checkpoint_000004", "checkpoint_000005"]
    assert run.failure is not None and not run.failure.saved and isinstance(run.failure.error, OSError)
    assert run.failure.checkpoint == run.checkpoint == run.directory / "checkpoints" / "checkpoint_000005"
    assert "saving the checkpoint failed (OSError)" == run.failure.not_saved_because


def test_checkpoints_every_interval(tmp_path: Path, ray_session: None) -> None:
    # Any iteration takes longer than a microsecond: a checkpoint after each; the default 600 s gives
    # only the final one (test_a_run_writes_params_progress_and_the_final_checkpoint).
    spec = RunSpec("pg", "CartPole-v1", TINY, stop={"training_iteration": 3}, checkpoint_interval_s=1e-6)
    with start_run(spec, results_dir=tmp_path) as run:
        run.train()
    assert checkpoints(run.directory) == ["checkpoint_000001", "checkpoint_000002", "checkpoint_000003"]


def test_keep_best_copies_the_best_checkpoint_and_a_resumed_run_knows_its_value(
    tmp_path: Path, ray_session: None
) -> None:
    spec = RunSpec(
        "pg",
        "CartPole-v1",
        TINY,
        stop={"training_iteration": 5},
        checkpoint_freq=1,
        keep_checkpoints=2,
        keep_best="score",
    )
    with start_run(spec, results_dir=tmp_path) as run:
        replace_train(run, with_scores([1.0, 5.0, math.nan, 7.0, 2.0]))
        run.train()
    run_dir = run.directory
    best = run_dir / "checkpoints" / "best"
    assert checkpoints(run_dir) == ["best", "checkpoint_000004", "checkpoint_000005"]
    metadata = json.loads((best / "metadata.json").read_text())
    assert metadata["iteration"] == 4 and metadata["keep_best"] == {"metric": "score", "value": 7.0}

    # Resumed from iteration 5, the best so far is still 7.0: 6.0 does not replace it, 8.0 does; the
    # checkpoint resumed from stays although it is not among the newest 2.
    point = find_resume_point(run_dir, stop={"training_iteration": 8})
    with resume_run(point) as resumed:
        replace_train(resumed, with_scores([6.0, 8.0, -1.0]))
        resumed.train()
    assert checkpoints(run_dir) == ["best", "checkpoint_000005", "checkpoint_000007", "checkpoint_000008"]
    metadata = json.loads((best / "metadata.json").read_text())
    assert metadata["iteration"] == 7 and metadata["keep_best"] == {"metric": "score", "value": 8.0}


def test_keep_best_warns_once_about_a_metric_no_result_has(tmp_path: Path, ray_session: None) -> None:
    spec = RunSpec(
        "pg", "CartPole-v1", TINY, stop={"training_iteration": 3}, checkpoint_freq=1, keep_best="episode_reward_maen"
    )
    with start_run(spec, results_dir=tmp_path) as run, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run.train()
    messages = [str(w.message) for w in caught if issubclass(w.category, RunWarning)]
    assert len(messages) == 1
    assert "keep_best='episode_reward_maen' is not a key of any result so far (up to iteration 1)" in messages[0]
    assert "did you mean 'episode_reward_mean'?" in messages[0]
    assert checkpoints(run.directory) == ["checkpoint_000001", "checkpoint_000002", "checkpoint_000003"]  # no best


def fail_at_call(n: int) -> Callable[[Callable[[], dict[str, Any]], int], dict[str, Any]]:
    def train(real_train: Callable[[], dict[str, Any]], call: int) -> dict[str, Any]:
        if call == n:
            raise WorkerFailureError("rollout worker 1 failed 3 times: out of restarts", worker_indices=[1])
        return real_train()

    return train


def test_an_error_leaves_an_emergency_checkpoint(tmp_path: Path, ray_session: None) -> None:
    with start_run(RunSpec("pg", "CartPole-v1", TINY, stop={"training_iteration": 5}), results_dir=tmp_path) as run:
        replace_train(run, fail_at_call(3))
        with pytest.raises(WorkerFailureError, match="out of restarts"):
            run.train()
    expected = run.directory / "checkpoints" / "checkpoint_000002"
    assert checkpoints(run.directory) == ["checkpoint_000002"] and run.checkpoint == expected
    assert run.failure is not None and run.failure.saved and run.failure.checkpoint == expected
    assert isinstance(run.failure.error, WorkerFailureError) and run.failure.not_saved_because is None
    assert json.loads((expected / "metadata.json").read_text())["iteration"] == 2
    assert find_resume_point(run.directory).iteration == 2


def test_no_emergency_checkpoint_of_a_broken_state_nor_of_one_already_saved(
    tmp_path: Path, ray_session: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = RunSpec("pg", "CartPole-v1", TINY, stop={"training_iteration": 5}, checkpoint_freq=2)
    with start_run(spec, results_dir=tmp_path) as run:
        replace_train(run, fail_at_call(4))
        monkeypatch.setattr(
            run.trainer, "state_problem", lambda: "policy 'default_policy' has non-finite weights in 'w'"
        )
        with pytest.raises(WorkerFailureError):
            run.train()
    assert checkpoints(run.directory) == ["checkpoint_000002"]
    assert run.failure is not None and not run.failure.saved
    assert (
        run.failure.not_saved_because
        == "the trainer's state is not intact: policy 'default_policy' has non-finite weights in 'w'"
    )
    assert run.failure.checkpoint == run.directory / "checkpoints" / "checkpoint_000002"

    with start_run(spec, results_dir=tmp_path) as run:
        replace_train(run, fail_at_call(3))  # iteration 2 is saved already
        with pytest.raises(WorkerFailureError):
            run.train()
    assert checkpoints(run.directory) == ["checkpoint_000002"]
    assert run.failure is not None and not run.failure.saved and run.failure.not_saved_because is None


def test_sighup_ends_training_with_a_checkpoint(tmp_path: Path, ray_session: None, sighup_default: None) -> None:
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)}

    def hang_up(result: dict[str, Any]) -> None:
        if result["training_iteration"] == 2:
            os.kill(os.getpid(), signal.SIGHUP)

    with start_run(RunSpec("pg", "CartPole-v1", TINY, stop={"training_iteration": 5}), results_dir=tmp_path) as run:
        summary = run.train(on_result=hang_up)
    assert summary.interrupted and summary.interrupted_by == signal.SIGHUP and not summary.save_interrupted
    assert summary.checkpoint == run.directory / "checkpoints" / "checkpoint_000002"
    assert {signum: signal.getsignal(signum) for signum in handlers} == handlers  # put back


def test_a_sigterm_that_surfaces_as_a_plain_keyboard_interrupt_is_still_named(
    tmp_path: Path, ray_session: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal landing in a blocking Ray call can reach the run as a plain KeyboardInterrupt."""
    with start_run(RunSpec("pg", "CartPole-v1", TINY, stop={"training_iteration": 5}), results_dir=tmp_path) as run:
        real_train = run.trainer.train

        def train() -> dict[str, Any]:
            result = real_train()
            if result["training_iteration"] == 2:
                try:
                    os.kill(os.getpid(), signal.SIGTERM)
                except KeyboardInterrupt:  # what ray.get turns the handler's exception into
                    raise KeyboardInterrupt from None
            return result

        monkeypatch.setattr(run.trainer, "train", train)
        summary = run.train()
    assert summary.interrupted_by == signal.SIGTERM
    assert summary.checkpoint == run.directory / "checkpoints" / "checkpoint_000002"


def test_a_second_signal_abandons_the_final_checkpoint(
    tmp_path: Path, ray_session: None, sighup_default: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = RunSpec("pg", "CartPole-v1", TINY, stop={"training_iteration": 5}, checkpoint_freq=2)
    with start_run(spec, results_dir=tmp_path) as run:
        real_save = run.trainer.save

        def save(checkpoint_dir: Any, metadata: Any = None) -> str:
            if run.trainer.iteration == 3:
                os.kill(os.getpid(), signal.SIGHUP)  # while the SIGTERM checkpoint is written
            return real_save(checkpoint_dir, metadata)

        def terminate(result: dict[str, Any]) -> None:
            if result["training_iteration"] == 3:
                os.kill(os.getpid(), signal.SIGTERM)

        monkeypatch.setattr(run.trainer, "save", save)
        summary = run.train(on_result=terminate)
    # The weights checkpoint written first stays the latest (tests/runs/test_preemption.py).
    assert summary.save_interrupted and summary.interrupted_by == signal.SIGTERM and summary.weights_only
    assert summary.checkpoint == run.directory / "checkpoints" / "checkpoint_000003"
    assert sorted(p.name for p in (run.directory / "checkpoints").iterdir()) == [
        "checkpoint_000002",
        "checkpoint_000003",
    ]  # nothing half-written


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
    # New criteria replace the run's own, as a whole: the run goes on under them.
    point = find_resume_point(run.directory, stop={"timesteps_total": 1000}, checkpoint_freq=5)
    assert point.spec.stop == {"timesteps_total": 1000} and point.spec.checkpoint_freq == 5
    assert point.stop_reason is None


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_resume_skips_a_corrupt_checkpoint(tmp_path: Path, ray_session: None) -> None:
    spec = RunSpec("pg", "CartPole-v1", TINY, stop={"training_iteration": 3}, checkpoint_freq=1)
    with start_run(spec, results_dir=tmp_path) as run:
        run.train()
    cps = run.directory / "checkpoints"
    flip_a_byte(cps / "checkpoint_000003" / "state.pkl")
    with pytest.warns(RunWarning, match="skipping checkpoint .*checkpoint_000003"):
        point = find_resume_point(run.directory, stop={"training_iteration": 4})
    assert point.checkpoint == cps / "checkpoint_000002" and point.iteration == 2 and point.drops_results
    assert [s.path for s in point.skipped] == [cps / "checkpoint_000003"]

    flip_a_byte(cps / "checkpoint_000002" / "state.pkl")
    flip_a_byte(cps / "checkpoint_000001" / "state.pkl")
    with pytest.warns(RunWarning), pytest.raises(CheckpointError, match="none of its 3 checkpoints is usable") as error:
        find_resume_point(run.directory)
    assert all(f"checkpoint_00000{n}" in str(error.value) for n in (1, 2, 3))


def test_resume_needs_a_run_directory_with_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(RunError, match="no such directory"):
        find_resume_point(tmp_path / "nowhere")
    with pytest.raises(RunError, match="no params.json"):
        find_resume_point(tmp_path)
    (tmp_path / "params.json").write_text(json.dumps({"algo": "pg", "env": "CartPole-v1", "config": {}}))
    assert read_run_spec(tmp_path) == RunSpec("pg", "CartPole-v1")
    with pytest.raises(CheckpointError, match="no checkpoint under"):
        find_resume_point(tmp_path)


# --- a storage path shared by the nodes of a cluster ------------------------------------------------------


@pytest.fixture
def no_trainer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if a Trainer is built: the storage path is checked before Ray or a Trainer starts."""
    import flowrl.engine.trainer

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a Trainer was built before the storage path was refused")

    monkeypatch.setattr(flowrl.engine.trainer, "Trainer", refuse)


def test_a_storage_path_must_be_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_trainer: None) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        RunError,
        match=r"storage path 'shared/runs' is relative; it must be absolute, naming the same "
        r"directory on every node",
    ):
        start_run(RunSpec("pg", "CartPole-v1", TINY), storage_path="shared/runs")
    with pytest.raises(RunError, match="storage path 'shared/runs' is relative"):
        find_resume_point("pg_CartPole-v1_20261124-010203", storage_path="shared/runs")
    assert not any(tmp_path.iterdir())


def test_results_dir_and_storage_path_are_not_given_together(tmp_path: Path, no_trainer: None) -> None:
    with pytest.raises(RunError, match="both say where the run directory goes: give one"):
        start_run(RunSpec("pg", "CartPole-v1", TINY), results_dir=tmp_path / "local", storage_path=tmp_path / "shared")
    assert not any(tmp_path.iterdir())


def test_a_storage_path_that_cannot_be_created_is_refused(tmp_path: Path, no_trainer: None) -> None:
    (tmp_path / "file").write_text("")
    storage = tmp_path / "file" / "runs"
    with pytest.raises(RunError, match=re.escape(f"storage path '{storage}': cannot create it (NotADirectoryError")):
        start_run(RunSpec("pg", "CartPole-v1", TINY), storage_path=storage)


def test_an_unwritable_storage_path_is_refused_before_any_run_directory(tmp_path: Path, no_trainer: None) -> None:
    storage = tmp_path / "read-only"
    storage.mkdir(mode=0o500)
    try:
        if os.access(storage, os.W_OK):
            pytest.skip("this user writes to read-only directories (root): permissions cannot refuse it")
        with pytest.raises(
            RunError,
            match=re.escape(
                f"storage path '{storage}' cannot hold checkpoints: creating a "
                f"directory (is it writable?) failed there (PermissionError"
            ),
        ):
            start_run(RunSpec("pg", "CartPole-v1", TINY), storage_path=storage)
        assert not any(storage.iterdir())
    finally:
        storage.chmod(0o700)


def refuse_with(code: int) -> Callable[..., None]:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OSError(code, os.strerror(code))

    return refuse


def test_a_filesystem_operation_checkpoints_need_is_probed_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_trainer: None
) -> None:
    storage = tmp_path / "mount"
    monkeypatch.setattr(os, "fsync", refuse_with(errno.ENOTSUP))
    with pytest.raises(
        RunError,
        match=re.escape(
            f"storage path '{storage}' cannot hold checkpoints: writing and fsyncing "
            f"a file failed there (OSError: [Errno {errno.ENOTSUP}]"
        ),
    ):
        start_run(RunSpec("pg", "CartPole-v1", TINY), storage_path=str(storage))
    assert not any(storage.iterdir())  # the probe is removed, and no run directory was made


@pytest.mark.parametrize(
    ("module", "name", "operation"),
    [(os, "link", "hard-linking a file (os.link)"), (fcntl, "flock", "locking a directory (fcntl.flock)")],
)
def test_what_checkpoints_can_do_without_is_a_warning(
    module: Any, name: str, operation: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(module, name, refuse_with(errno.ENOTSUP))
    with pytest.warns(StorageWarning, match=re.escape(f"storage path '{tmp_path}': {operation} failed there")):
        assert check_storage_path(str(tmp_path)) == tmp_path
    assert not any(tmp_path.iterdir())  # the probe is removed


def test_an_unknown_run_name_lists_the_runs_under_the_storage_path(tmp_path: Path) -> None:
    now = time.time()
    for age in range(7):
        params = tmp_path / f"pg_CartPole-v1_2026112{age}-000000" / "params.json"
        params.parent.mkdir()
        params.write_text("{}")
        os.utime(params, (now - 60 * age, now - 60 * age))
    (tmp_path / "notes").mkdir()  # not a run directory: no params.json
    assert find_run_dir("pg_CartPole-v1_20261123-000000", tmp_path) == tmp_path / "pg_CartPole-v1_20261123-000000"
    with pytest.raises(RunError) as error:
        find_run_dir("pg_CartPole-v1_20261130-000000", str(tmp_path))
    newest = ", ".join(f"pg_CartPole-v1_2026112{age}-000000" for age in range(5))
    assert str(error.value) == (
        f"no run directory 'pg_CartPole-v1_20261130-000000' under storage path '{tmp_path}'; "
        f"the newest there: {newest} (7 in all)"
    )
    with pytest.raises(RunError, match="under storage path .*notes'; it holds no run directories"):
        find_run_dir("pg_CartPole-v1_20261130-000000", tmp_path / "notes")
    with pytest.raises(RunError, match="does not exist on this node \\(is the shared filesystem mounted here\\?\\)"):
        find_run_dir("pg_CartPole-v1_20261130-000000", tmp_path / "unmounted")


def test_a_run_on_a_storage_path_records_it_and_resumes_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ray_session: None
) -> None:
    storage = tmp_path / "shared" / "runs"  # created by the run
    with start_run(RunSpec("pg", "CartPole-v1", TINY, stop={"training_iteration": 1}), storage_path=storage) as run:
        run.train()
    assert run.directory.parent == storage and [p.name for p in storage.iterdir()] == [run.directory.name]
    assert json.loads((run.directory / "params.json").read_text())["storage_path"] == str(storage)
    by_name = find_resume_point(run.directory.name, storage_path=storage, stop={"training_iteration": 2})
    # No storage_path given: params.json says the run lives on one, so its directory is made absolute.
    monkeypatch.chdir(storage.parent)
    by_path = find_resume_point(Path("runs") / run.directory.name, stop={"training_iteration": 2})
    assert by_name.directory == by_path.directory == run.directory
    assert by_name.storage_path == by_path.storage_path == storage
    with resume_run(by_path) as resumed:
        resumed.train()
    assert [r["training_iteration"] for r in progress(run.directory)] == [1, 2]
    assert json.loads((run.directory / "params.json").read_text())["storage_path"] == str(storage)
