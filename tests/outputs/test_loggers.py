"""flowrl.outputs.loggers: TensorBoard event files, progress.csv and the W&B / MLflow trackers of a run directory."""

from __future__ import annotations

import csv
import json
import math
import shutil
import struct
import sys
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from event_files import event_scalars
from fakes import checkpoints

from flowrl.errors import ConfigError, RunError, RunWarning
from flowrl.outputs.loggers import (
    CSVLogger,
    TensorBoardLogger,
    flatten_result,
    mlflow_key,
    open_loggers,
    result_step,
    scalar_metrics,
)
from flowrl.runs.resume import find_resume_point, resume_run
from flowrl.runs.run import start_run
from flowrl.storage.rundir import RunSpec, read_run_spec

pytestmark = pytest.mark.unit

# One process, two tiny SGD batches per iteration: each training iteration takes milliseconds.
TINY = {"num_workers": 0, "train_batch_size": 64, "rollout_fragment_length": 32, "seed": 0}
LEARNER_TAG = "info/learner/default_policy/policy_loss"


def csv_rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


# --- flattening (no Ray) -------------------------------------------------------------------------------


def test_results_flatten_to_slash_keys_and_only_finite_numbers_are_metrics() -> None:
    result = {
        "episode_reward_mean": 21.5,
        "timesteps_total": 128,
        "done": False,
        "algo": "pg",
        "hist": [1.0, 2.0],
        "episode_reward_min": math.nan,
        "loss_scale": math.inf,
        "info": {"learner": {"default_policy": {"policy_loss": np.float32(0.5), "grad_steps": np.int64(3)}}},
        "evaluation": {},
    }
    assert flatten_result(result)["info/learner/default_policy/policy_loss"] == np.float32(0.5)
    assert scalar_metrics(result) == {
        "episode_reward_mean": 21.5,
        "timesteps_total": 128.0,
        LEARNER_TAG: 0.5,
        "info/learner/default_policy/grad_steps": 3.0,
    }
    assert result_step(result) == 128
    assert result_step({"training_iteration": 4}) == 4  # no timesteps_total: the iteration
    assert mlflow_key("plan/3:for_each(TrainOneStep)/time_s") == "plan/3:for_each_TrainOneStep_/time_s"


# --- progress.csv (no Ray) -----------------------------------------------------------------------------


def test_csv_widens_its_header_when_a_key_first_appears_later(tmp_path: Path) -> None:
    path = tmp_path / "progress.csv"
    logger = CSVLogger(path)
    logger.log_result({"training_iteration": 1, "episode_reward_mean": 10.5, "info": {"learner": {"loss": 0.25}}})
    assert csv_rows(path)[0] == ["training_iteration", "episode_reward_mean", "info/learner/loss"]
    # Evaluation every 2 iterations: its keys first appear at iteration 2, and a NaN and a list are left empty.
    logger.log_result(
        {
            "training_iteration": 2,
            "episode_reward_mean": math.nan,
            "hist": [1, 2],
            "evaluation": {"episode_reward_mean": 200.0},
            "info": {"learner": {"loss": 0.5}},
        }
    )
    logger.log_result({"training_iteration": 3, "episode_reward_mean": 12.0, "info": {"learner": {"loss": 0.75}}})
    logger.close()
    header, rows = csv_rows(path)
    assert header == [
        "training_iteration",
        "episode_reward_mean",
        "info/learner/loss",
        "evaluation/episode_reward_mean",
    ]
    assert [row["training_iteration"] for row in rows] == ["1", "2", "3"]
    assert [row["evaluation/episode_reward_mean"] for row in rows] == ["", "200.0", ""]
    assert [row["episode_reward_mean"] for row in rows] == ["10.5", "", "12.0"]
    assert [row["info/learner/loss"] for row in rows] == ["0.25", "0.5", "0.75"]


def test_csv_starts_from_the_results_a_resumed_run_kept(tmp_path: Path) -> None:
    path = tmp_path / "progress.csv"
    path.write_text("training_iteration,stale\n1,x\n2,x\n3,x\n")  # iteration 3 came after the checkpoint
    logger = CSVLogger(path, [{"training_iteration": 1, "a": 1}, {"training_iteration": 2, "b": 2}])
    logger.log_result({"training_iteration": 3, "a": 3})
    header, rows = csv_rows(path)
    assert header == ["training_iteration", "a", "b"]
    cells = [(row["training_iteration"], row["a"], row["b"]) for row in rows]
    assert cells == [("1", "1", ""), ("2", "", "2"), ("3", "3", "")]


# --- TensorBoard (no Ray) -----------------------------------------------------------------------------


def test_tensorboard_scalars_skip_what_is_not_a_finite_number_and_a_purge_hides_later_points(tmp_path: Path) -> None:
    logger = TensorBoardLogger(tmp_path)
    for iteration in (1, 2, 3):
        logger.log_result(
            {
                "training_iteration": iteration,
                "timesteps_total": 100 * iteration,
                "episode_reward_mean": math.nan if iteration == 1 else float(iteration),
                "note": "text",
                "info": {"learner": {"default_policy": {"policy_loss": iteration / 10}}},
            }
        )
    logger.close()
    scalars = event_scalars(tmp_path)
    assert scalars["episode_reward_mean"] == [(200, 2.0), (300, 3.0)]
    assert [step for step, _ in scalars[LEARNER_TAG]] == [100, 200, 300]
    assert "note" not in scalars

    # Resumed from the checkpoint at step 200: iteration 3 is trained again, and shown once.
    resumed = TensorBoardLogger(tmp_path, purge_step=201)
    resumed.log_result({"training_iteration": 3, "timesteps_total": 300, "episode_reward_mean": 30.0})
    resumed.close()
    assert event_scalars(tmp_path)["episode_reward_mean"] == [(200, 2.0), (300, 30.0)]


# --- trackers asked for but missing (no Ray) ----------------------------------------------------------


def test_a_missing_tracker_package_is_reported_with_the_pip_command_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "mlflow", None)
    spec = RunSpec("pg", "CartPole-v1", TINY, wandb_project="cartpole", mlflow_tracking_uri="http://localhost:5000")
    with pytest.raises(RunError, match=r"wandb package.*MLflow tracking client.*pip install 'flowrl-ray\[tracking\]'"):
        start_run(spec, results_dir=tmp_path)
    assert not any(tmp_path.iterdir())  # checked before the Trainer and the run directory
    with pytest.raises(RunError, match="pip install 'flowrl"):
        open_loggers(tmp_path, {}, mlflow_tracking_uri="file:/nowhere")
    assert not any(tmp_path.iterdir())


def test_tracker_settings_are_checked_and_kept_in_params_json(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        RunSpec("pg", "CartPole-v1", wandb_project="", mlflow_tracking_uri=cast(Any, 5))
    assert len(raised.value.problems) == 2 and "wandb_project=''" in str(raised.value)
    spec = RunSpec("pg", "CartPole-v1", wandb_project="cartpole", mlflow_tracking_uri="http://localhost:5000")
    (tmp_path / "params.json").write_text(json.dumps(spec.to_params()))
    assert read_run_spec(tmp_path) == spec
    assert "wandb_project" not in RunSpec("pg", "CartPole-v1").to_params()  # only when set


# --- a run's event files and progress.csv ------------------------------------------------------------


def test_a_run_writes_event_files_and_progress_csv_and_a_resume_continues_them(
    tmp_path: Path, ray_session: None
) -> None:
    spec = RunSpec("pg", "CartPole-v1", TINY, stop={"training_iteration": 3}, checkpoint_freq=1)
    with start_run(spec, results_dir=tmp_path) as run:
        run.train()
    run_dir = run.directory
    scalars = event_scalars(run_dir)
    assert [step for step, _ in scalars["episode_reward_mean"]] == [64, 128, 192]
    assert [step for step, _ in scalars[LEARNER_TAG]] == [64, 128, 192]
    assert [value for _, value in scalars["training_iteration"]] == [1, 2, 3]
    assert any(tag.startswith("plan/") for tag in scalars)  # per-operator statistics, per tag
    header, rows = csv_rows(run_dir / "progress.csv")
    assert {"episode_reward_mean", "timesteps_total", LEARNER_TAG} <= set(header)
    assert [row["timesteps_total"] for row in rows] == ["64", "128", "192"]

    # The run dies before checkpointing iteration 3; it resumes from 2 and trains 3 and 4.
    shutil.rmtree(run_dir / "checkpoints" / "checkpoint_000003")
    with resume_run(find_resume_point(run_dir, stop={"training_iteration": 4})) as resumed:
        resumed.train()
    assert checkpoints(run_dir)[-1] == "checkpoint_000004"
    scalars = event_scalars(run_dir)
    assert [step for step, _ in scalars["episode_reward_mean"]] == [64, 128, 192, 256]  # iteration 3 once
    assert [value for _, value in scalars["training_iteration"]] == [1, 2, 3, 4]
    header, rows = csv_rows(run_dir / "progress.csv")
    assert [row["training_iteration"] for row in rows] == ["1", "2", "3", "4"]
    assert LEARNER_TAG in header


class BrokenLogger:
    def __init__(self) -> None:
        self.calls = 0

    def log_result(self, result: Mapping[str, Any]) -> None:
        self.calls += 1
        raise OSError("disk full")

    def close(self) -> None:
        raise OSError("disk still full")


def test_a_failing_logger_is_reported_once_and_the_run_goes_on(tmp_path: Path, ray_session: None) -> None:
    broken = BrokenLogger()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with start_run(RunSpec("pg", "CartPole-v1", TINY, stop={"training_iteration": 3}), results_dir=tmp_path) as run:
            run.loggers.append(broken)
            summary = run.train()
    assert summary.stop_reason == "training_iteration 3 >= 3" and broken.calls == 3
    messages = [str(w.message) for w in caught if issubclass(w.category, RunWarning)]
    assert len(messages) == 1 and "BrokenLogger failed while logging a result (OSError: disk full)" in messages[0]
    assert len(csv_rows(run.directory / "progress.csv")[1]) == 3  # the other loggers went on


# --- Weights & Biases and MLflow ----------------------------------------------------------------------


def wandb_records(run_file: Path) -> list[Any]:
    """The records of an offline W&B run's ``.wandb`` file: a LevelDB-style log of protobuf ``Record`` messages.

    The file starts with a 7-byte header (``:W&B``, magic, version), then 32 KiB blocks of chunks,
    each with a 7-byte header (checksum, length, type: 1 whole record, 2 first, 3 middle, 4 last part).
    """
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, pos, block = [], b"", 7, 32 * 1024
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            break
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def finished_wandb_records(run_file: Path, timeout_s: float = 120.0) -> list[Any]:
    """The records of an offline W&B run once its file ends with the run's exit record.

    ``run.finish()`` returns once W&B's service process has the exit record; that process writes
    the file on its own schedule.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        records = wandb_records(run_file)
        if records and records[-1].WhichOneof("record_type") == "exit":
            return records
        assert time.monotonic() < deadline, f"{run_file} has no exit record after {timeout_s}s"
        time.sleep(0.2)


def wandb_history(records: list[Any]) -> list[dict[str, Any]]:
    rows = []
    for record in records:
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
    return rows


def test_wandb_offline_run_gets_the_config_and_metrics_and_a_resume_continues_it(
    tmp_path: Path, ray_session: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb", reason="the tracking extra (pip install 'flowrl-ray[tracking]') is not installed")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for variable in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):  # nothing written outside tmp_path
        monkeypatch.setenv(variable, str(tmp_path / "wandb-home"))
    spec = RunSpec(
        "pg", "CartPole-v1", TINY, stop={"training_iteration": 3}, checkpoint_freq=1, wandb_project="flowrl-tests"
    )
    with start_run(spec, results_dir=tmp_path / "results") as run:
        run.train()
    run_dir = run.directory
    run_id = json.loads((run_dir / "trackers.json").read_text())["wandb"]["run_id"]
    [first] = (run_dir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")
    records = finished_wandb_records(first)
    history = wandb_history(records)
    assert [row["training_iteration"] for row in history] == [1, 2, 3]
    assert [row["timesteps_total"] for row in history] == [64, 128, 192]
    assert all(math.isfinite(row["episode_reward_mean"]) and LEARNER_TAG in row for row in history)
    [run_record] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    config = {item.key: json.loads(item.value_json) for item in run_record.config.update}
    assert config["algo"] == "pg" and config["config"]["train_batch_size"] == 64

    # W&B names an offline run's directory by the second it started: a resume within the same second as
    # the first run (three tiny iterations take less) would write into the first run's directory.
    time.sleep(1.05 - time.time() % 1)
    with resume_run(find_resume_point(run_dir, stop={"training_iteration": 4})) as resumed:
        resumed.train()
    assert json.loads((run_dir / "trackers.json").read_text())["wandb"]["run_id"] == run_id  # the same W&B run
    runs = (run_dir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")
    [second] = [path for path in runs if path != first]
    assert [row["training_iteration"] for row in wandb_history(finished_wandb_records(second))] == [4]


def test_mlflow_run_gets_the_params_and_metrics_and_a_resume_continues_it(
    tmp_path: Path, ray_session: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow", reason="the tracking extra (pip install 'flowrl-ray[tracking]') is not installed")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for this to use a local file store
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    uri = (tmp_path / "mlruns").as_uri()
    spec = RunSpec("pg", "CartPole-v1", TINY, stop={"training_iteration": 3}, mlflow_tracking_uri=uri)
    with start_run(spec, results_dir=tmp_path / "results") as run:
        run.train()
    run_id = json.loads((run.directory / "trackers.json").read_text())["mlflow"]["run_id"]
    client = MlflowClient(tracking_uri=uri)
    mlflow_run = client.get_run(run_id)
    assert mlflow_run.info.status == "FINISHED" and mlflow_run.info.run_name == run.directory.name
    assert client.get_experiment(mlflow_run.info.experiment_id).name == "flowrl"
    assert mlflow_run.data.params["algo"] == "pg" and mlflow_run.data.params["config/train_batch_size"] == "64"
    history = client.get_metric_history(run_id, "episode_reward_mean")
    assert [metric.step for metric in history] == [64, 128, 192]
    assert len(client.get_metric_history(run_id, LEARNER_TAG)) == 3

    with resume_run(find_resume_point(run.directory, stop={"training_iteration": 4})) as resumed:
        resumed.train()
    assert json.loads((run.directory / "trackers.json").read_text())["mlflow"]["run_id"] == run_id
    assert [metric.step for metric in client.get_metric_history(run_id, "episode_reward_mean")] == [64, 128, 192, 256]
    assert client.get_run(run_id).info.status == "FINISHED"


def test_a_tracker_run_that_cannot_start_is_a_run_error(tmp_path: Path) -> None:
    pytest.importorskip("mlflow", reason="the tracking extra (pip install 'flowrl-ray[tracking]') is not installed")
    with pytest.raises(RunError, match="cannot start an MLflow run at 'nowhere:thing'"):
        open_loggers(tmp_path, {}, mlflow_tracking_uri="nowhere:thing")


def test_flowrl_train_mlflow_flag_is_kept_in_params_json_and_a_resume_logs_to_the_same_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ray_session: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow", reason="the tracking extra (pip install 'flowrl-ray[tracking]') is not installed")
    from mlflow.tracking import MlflowClient

    from flowrl.cli import main as cli

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "cli-runs")
    uri = (tmp_path / "mlruns").as_uri()
    results = tmp_path / "results"
    argv = [
        "train",
        "--algo",
        "pg",
        "--env",
        "CartPole-v1",
        "--num-workers",
        "0",
        "--set",
        "train_batch_size=64",
        "--set",
        "rollout_fragment_length=32",
        "--results-dir",
        str(results),
        "--quiet",
    ]
    assert cli.main([*argv, "--stop-iters", "1", "--mlflow", uri]) == 0
    [run_dir] = results.iterdir()
    assert read_run_spec(run_dir).mlflow_tracking_uri == uri
    assert cli.main(["train", "--resume", str(run_dir), "--stop-iters", "2", "--quiet"]) == 0
    run_id = json.loads((run_dir / "trackers.json").read_text())["mlflow"]["run_id"]
    client = MlflowClient(tracking_uri=uri)
    assert client.get_experiment(client.get_run(run_id).info.experiment_id).name == "cli-runs"
    assert [metric.value for metric in client.get_metric_history(run_id, "training_iteration")] == [1, 2]
