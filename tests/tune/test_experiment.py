"""Experiments on Ray Tune through ``flowrl.tune.run`` and ``flowrl tune``: trials side by side, ASHA's
early stopping, the experiment directory and trials.csv, and resuming an interrupted experiment."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from ray.tune import Callback
from ray.tune.experiment import Trial

from flowrl.cli.main import main
from flowrl.errors import RunError
from flowrl.tune import run

pytestmark = [pytest.mark.tune, pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
# One process per trial (no remote workers) on half a CPU: two trials fit the session's 2 CPUs.
TINY = {
    "num_workers": 0,
    "num_cpus_for_driver": 0.5,
    "train_batch_size": 1000,
    "sgd_minibatch_size": 250,
    "num_sgd_iter": 2,
    "rollout_fragment_length": 200,
    "seed": 0,
}


def experiment(stop_iters: int, lrs: list[float], **top: Any) -> dict[str, Any]:
    return {
        "algo": "ppo",
        "env": "CartPole-v1",
        "stop": {"training_iteration": stop_iters},
        "config": {**TINY, "lr": {"grid_search": lrs}},
        **top,
    }


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def iterations(trial_dir: Path) -> list[int]:
    """The training_iteration of each line of a trial's progress.jsonl (flowrl's run-directory layout)."""
    return [json.loads(line)["training_iteration"] for line in (trial_dir / "progress.jsonl").read_text().splitlines()]


class ResultTimes(Callback):
    """When each trial started running and reported each result, by the driver's clock."""

    def __init__(self) -> None:
        self.started: dict[str, float] = {}
        self.times: dict[str, list[float]] = {}

    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.started[trial.trial_id] = time.monotonic()

    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any
    ) -> None:
        self.times.setdefault(trial.trial_id, []).append(time.monotonic())


def test_a_grid_runs_its_trials_side_by_side_and_reports_the_best(tmp_path: Path) -> None:
    times = ResultTimes()
    summary = run(experiment(10, [0.01, 0.001]), results_dir=tmp_path, verbose=False, callbacks=[times])
    # Each started running (Tune starts a trial once its resources are free) before the other's last result:
    # side by side, not one after the other. (First results can come later than the other's last under load.)
    [(first, first_start), (second, second_start)] = [(times.times[i], times.started[i]) for i in times.times]
    assert first_start < second[-1] and second_start < first[-1]
    assert [t.status for t in summary.trials] == ["TERMINATED", "TERMINATED"]
    assert [t.iterations for t in summary.trials] == [10, 10]
    best = max(summary.trials, key=lambda t: t.last or 0.0)
    assert summary.best == best and best.config == {"lr": best.config["lr"]}
    assert summary.directory.parent == tmp_path and summary.directory.name.startswith("ppo_CartPole-v1_")
    rows = read_csv(summary.directory / "trials.csv")
    assert sorted(row["config/lr"] for row in rows) == ["0.001", "0.01"]
    assert {row["status"] for row in rows} == {"TERMINATED"}
    assert float(next(r for r in rows if r["trial_id"] == best.trial_id)["last_episode_reward_mean"]) == best.last
    for trial in summary.trials:  # each trial directory is a flowrl run directory
        assert trial.directory is not None and iterations(trial.directory) == list(range(1, 11))
        assert json.loads((trial.directory / "params.json").read_text())["algo"] == "ppo"
        # ... whose plan, X-ray and traced iteration (trace_iterations "2:2") the plan, doctor and trace commands read
        assert main(["plan", str(trial.directory)]) == 0 and main(["doctor", str(trial.directory)]) == 0
        assert main(["trace", str(trial.directory), "-o", str(tmp_path / f"{trial.trial_id}.json")]) == 0
        assert json.loads((tmp_path / f"{trial.trial_id}.json").read_text())["otherData"]["iterations"] == [2]
    assert json.loads((summary.directory / "spec.json").read_text())["algo"] == "ppo"


def test_asha_stops_a_clearly_bad_trial_early(tmp_path: Path) -> None:
    # One trial at a time, the good one first: the bad one meets the good one's result at each rung.
    spec = experiment(
        8,
        [0.01, 1e-8],
        max_concurrent_trials=1,
        scheduler={"type": "asha", "grace_period": 4, "max_t": 8, "reduction_factor": 2},
    )
    summary = run(spec, results_dir=tmp_path, verbose=False)
    by_lr = {trial.config["lr"]: trial for trial in summary.trials}
    assert by_lr[0.01].iterations == 8
    assert by_lr[1e-8].iterations == 4, [(t.config, t.iterations, t.last) for t in summary.trials]
    assert by_lr[1e-8].status == "TERMINATED"


# Runs an experiment that a callback interrupts (SIGINT, as Ctrl-C) at its trial's third result.
# The callback is defined in __main__, so that Tune's saved state holds it by value and a resume
# in another process can load it; it does nothing once its marker file exists.
INTERRUPTED_RUN = """
import json, signal, sys
from pathlib import Path
from ray.tune import Callback
from flowrl.tune import run

class InterruptOnce(Callback):
    def __init__(self, marker):
        self.marker = marker

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if result["training_iteration"] == 3 and not self.marker.exists():
            self.marker.touch()
            signal.raise_signal(signal.SIGINT)  # Tune's handler: stop the trials, save the experiment's state

interrupt = InterruptOnce(Path(sys.argv[3]))
summary = run(json.loads(sys.argv[1]), results_dir=sys.argv[2], verbose=False, callbacks=[interrupt])
print(json.dumps({"directory": str(summary.directory), "signal": summary.interrupted_by,
                  "trials": [[t.status, t.iterations] for t in summary.trials]}))
"""


def test_flowrl_tune_resume_continues_an_interrupted_experiment_from_its_checkpoints(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    spec = json.dumps(experiment(6, [0.01], checkpoint_freq=1))
    first = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_RUN, spec, str(tmp_path), str(tmp_path / "interrupted")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    interrupted = json.loads(first.stdout.splitlines()[-1])
    [[status, done]] = interrupted["trials"]
    assert interrupted["signal"] == signal.SIGINT, interrupted
    assert status not in ("TERMINATED", "ERROR") and 3 <= done < 6, interrupted
    directory = Path(interrupted["directory"])
    assert read_csv(directory / "trials.csv")[0]["status"] == status

    # In a new process, on a new Ray instance: only the experiment directory carries the state.
    resumed = subprocess.run(
        [sys.executable, "-m", "flowrl.cli", "tune", "--resume", str(directory)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    [row] = read_csv(directory / "trials.csv")
    assert (row["status"], row["iterations"]) == ("TERMINATED", "6")
    # It went on from a checkpoint: iteration 1 once, then on; progress.jsonl keeps the results of both runs.
    seen = iterations(Path(row["directory"]))
    assert seen.count(1) == 1 and seen == sorted(seen) and set(seen) == set(range(1, 7)), seen


def test_run_refuses_an_existing_experiment_name_and_a_directory_it_cannot_resume(tmp_path: Path) -> None:
    (tmp_path / "grid").mkdir()
    (tmp_path / "grid" / "something").touch()
    with pytest.raises(RunError, match="already exists: continue it with flowrl tune --resume"):
        run({"grid": experiment(1, [0.01])}, results_dir=tmp_path)
    with pytest.raises(RunError, match="not an experiment directory of flowrl tune: it has no spec.json"):
        run(resume=tmp_path / "grid")


def test_flowrl_tune_runs_an_experiment_file(tmp_path: Path) -> None:
    config = tmp_path / "grid.json"
    config.write_text(json.dumps({"grid": experiment(2, [0.01, 0.001])}))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    command = [sys.executable, "-m", "flowrl.cli", "tune", "--config", str(config), "--results-dir", str(tmp_path)]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=200, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trials: 2 (2 terminated)" in done.stdout and "best trial: " in done.stdout, done.stdout
    rows = read_csv(tmp_path / "grid" / "trials.csv")
    assert [row["status"] for row in rows] == ["TERMINATED", "TERMINATED"]
    assert sorted(row["config/lr"] for row in rows) == ["0.001", "0.01"]
    # Not on a terminal: plain lines (the trials' "(flowrl_ppo pid=...)" lines too), short trial directory names.
    assert "\x1b[" not in done.stdout + done.stderr and "Exception ignored" not in done.stderr, done.stderr[-3000:]
    names = sorted(Path(row["directory"]).name for row in rows)
    assert [re.sub(r"_[0-9a-f]+$", "", name) for name in names] == ["ppo_CartPole-v1_0", "ppo_CartPole-v1_1"], names
    # The best trial directory it prints is what flowrl evaluate takes.
    [best] = re.findall(r"^best trial directory: (.+)$", done.stdout, re.MULTILINE)
    assert main(["evaluate", best, "--episodes", "1"]) == 0


def test_flowrl_tune_reports_a_bad_spec_as_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("algo: ppo\nenv: CartPole-v1\nconfig:\n  lr: {normal: [0, 1]}\n")
    assert main(["tune", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "flowrl: error: invalid config (1 problem):\n  - unknown search space 'normal' for config key lr" in err
    assert main(["tune", "--resume", str(tmp_path), "--config", str(config)]) == 2


def test_a_failed_trial_is_reported_and_flowrl_tune_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "dqn.json"  # DQN takes discrete actions only: the trial fails as its trainer starts
    config.write_text(
        json.dumps(
            {
                "algo": "dqn",
                "env": "Pendulum-v1",
                "stop": {"training_iteration": 2},
                "config": {"num_workers": 0, "num_cpus_for_driver": 0.5},
            }
        )
    )
    assert main(["tune", "--config", str(config), "--results-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert re.search(r"flowrl: error: trial \w+ failed: .*Discrete.* \(traceback: .*error.txt\)", err), err
    [directory] = tmp_path.glob("dqn_Pendulum-v1_*")
    assert [row["status"] for row in read_csv(directory / "trials.csv")] == ["ERROR"]
