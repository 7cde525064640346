"""The ``flowrl`` command, run in-process through ``flowrl.cli.main`` with tiny PG configs."""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fakes import checkpoints, progress

from flowrl.cli import args as cli_args
from flowrl.cli import main as cli
from flowrl.engine.trainer import Trainer
from flowrl.envs import register_env
from flowrl.envs.testing import FaultInjectEnv
from flowrl.errors import CLIError
from flowrl.runs.experiment import load_experiment_file
from flowrl.storage.rundir import json_safe

pytestmark = pytest.mark.unit

# One process, two tiny SGD batches per run: each training iteration takes milliseconds.
TINY = ["--num-workers", "0", "--set", "train_batch_size=64", "--set", "rollout_fragment_length=32"]


def train(tmp_path: Path, *extra: str) -> int:
    return cli.main(["train", "--algo", "pg", "--env", "CartPole-v1", "--results-dir", str(tmp_path), *TINY, *extra])


def run_dir(results_dir: Path) -> Path:
    (found,) = [p for p in results_dir.iterdir() if p.is_dir()]
    return found


def args_for(*argv: str) -> Any:
    return cli.build_parser().parse_args(["train", *argv])


# --- train -------------------------------------------------------------------------------------------


def test_train_writes_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str], ray_session: None) -> None:
    assert train(tmp_path, "--stop-iters", "2", "--seed", "3") == 0
    run = run_dir(tmp_path)
    assert run.name.startswith("pg_CartPole-v1_")
    params = json.loads((run / "params.json").read_text())
    assert params["algo"] == "pg" and params["env"] == "CartPole-v1"
    assert params["stop"] == {"training_iteration": 2}
    assert params["config"]["train_batch_size"] == 64 and params["config"]["seed"] == 3
    results = progress(run)
    assert [r["training_iteration"] for r in results] == [1, 2]
    assert results[-1]["timesteps_total"] == 128
    assert checkpoints(run) == ["checkpoint_000002"]  # --checkpoint-freq 0: only the final one
    out = capsys.readouterr().out
    assert out.count("\niter ") + out.startswith("iter ") == 2
    assert "steps/s" in out and "reward" in out
    assert "stopped: training_iteration 2 >= 2" in out
    assert str(run / "checkpoints" / "checkpoint_000002") in out


def test_stop_timesteps_and_checkpoint_freq(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ray_session: None
) -> None:
    assert train(tmp_path, "--stop-timesteps", "150", "--checkpoint-freq", "1") == 0
    run = run_dir(tmp_path)
    assert [r["timesteps_total"] for r in progress(run)] == [64, 128, 192]
    assert checkpoints(run) == ["checkpoint_000001", "checkpoint_000002", "checkpoint_000003"]
    assert "stopped: timesteps_total 192 >= 150" in capsys.readouterr().out


def test_config_file_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str], ray_session: None) -> None:
    # RLlib's tuned-example layout: one experiment name, "run", stop criteria and a config dict.
    file = tmp_path / "cartpole.yaml"
    file.write_text(
        "cartpole-pg:\n  run: PG\n  env: CartPole-v1\n  stop:\n    training_iteration: 1\n"
        "  config:\n    lr: 5e-3\n    num_workers: 0\n    train_batch_size: 32\n    rollout_fragment_length: 32\n"
    )
    results = tmp_path / "results"
    assert cli.main(["train", "--config", str(file), "--results-dir", str(results)]) == 0
    run = run_dir(results)
    params = json.loads((run / "params.json").read_text())
    assert params["config"]["lr"] == 5e-3 and params["stop"] == {"training_iteration": 1}
    assert len(progress(run)) == 1


def test_resume_continues_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str], ray_session: None) -> None:
    assert train(tmp_path, "--stop-iters", "1") == 0
    run = run_dir(tmp_path)
    # The stop criterion is already met: nothing runs without a larger one.
    assert cli.main(["train", "--resume", str(run)]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert cli.main(["train", "--resume", str(run), "--stop-iters", "3"]) == 0
    results = progress(run)
    assert [r["training_iteration"] for r in results] == [1, 2, 3]
    assert [r["timesteps_total"] for r in results] == [64, 128, 192]
    assert checkpoints(run) == ["checkpoint_000001", "checkpoint_000003"]
    assert json.loads((run / "params.json").read_text())["stop"] == {"training_iteration": 3}
    out = capsys.readouterr().out
    assert "resuming pg on CartPole-v1" in out and "iter    2" in out


def test_resume_drops_results_after_the_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ray_session: None
) -> None:
    assert train(tmp_path, "--stop-iters", "2", "--checkpoint-freq", "1") == 0
    run = run_dir(tmp_path)
    shutil.rmtree(run / "checkpoints" / "checkpoint_000002")  # as if the run died before saving it
    with open(run / "progress.jsonl", "a") as f:
        f.write('{"training_iteration": 3, "timest')  # and mid-line
    assert cli.main(["train", "--resume", str(run), "--stop-iters", "3", "--seed", "0"]) == 2
    assert (
        f"--seed 0 differs from the run's seed None (it is unseeded; in {run / 'params.json'})"
        in capsys.readouterr().err
    )
    assert cli.main(["train", "--resume", str(run), "--stop-iters", "3"]) == 0
    assert [r["training_iteration"] for r in progress(run)] == [1, 2, 3]
    assert "dropped the results after iteration 1" in capsys.readouterr().out


def test_resume_accepts_the_runs_own_algo_env_and_seed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ray_session: None
) -> None:
    assert train(tmp_path, "--stop-iters", "1", "--seed", "3") == 0
    run = run_dir(tmp_path)
    params = run / "params.json"
    err = error_of(capsys, ["train", "--resume", str(run), "--algo", "ppo", "--env", "Pendulum-v1", "--seed", "4"])
    assert f"--algo ppo differs from the run's algo pg (in {params})" in err
    assert f"--env Pendulum-v1 differs from the run's env CartPole-v1 (in {params})" in err
    assert f"--seed 4 differs from the run's seed 3 (in {params})" in err
    # What users type: the command that started the run, with --resume added.
    assert (
        cli.main(
            [
                "train",
                "--resume",
                str(run),
                "--algo",
                "PG",
                "--env",
                "cartpole-v1",
                "--seed",
                "3",
                "--stop-iters",
                "2",
                "--keep-checkpoints",
                "1",
                "--checkpoint-interval-s",
                "0",
            ]
        )
        == 0
    )
    assert [r["training_iteration"] for r in progress(run)] == [1, 2]
    # The checkpoint resumed from is kept although only the newest one is.
    assert checkpoints(run) == ["checkpoint_000001", "checkpoint_000002"]
    spec = json.loads(params.read_text())
    assert (spec["keep_checkpoints"], spec["checkpoint_interval_s"], spec["config"]["seed"]) == (1, 0.0, 3)


def test_resume_falls_back_from_a_corrupt_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ray_session: None
) -> None:
    assert train(tmp_path, "--stop-iters", "2", "--checkpoint-freq", "1") == 0
    run = run_dir(tmp_path)
    state = run / "checkpoints" / "checkpoint_000002" / "state.pkl"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(run), "--stop-iters", "3"]) == 0
    captured = capsys.readouterr()
    assert f"flowrl: warning: skipped checkpoint {state.parent}: " in captured.err
    assert f"from {run / 'checkpoints' / 'checkpoint_000001'} (iteration 1)" in captured.out
    assert [r["training_iteration"] for r in progress(run)] == [1, 2, 3]


def test_checkpoint_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str], ray_session: None) -> None:
    assert (
        train(
            tmp_path,
            "--stop-iters",
            "4",
            "--checkpoint-interval-s",
            "0.000001",
            "--keep-checkpoints",
            "2",
            "--keep-best",
            "timesteps_total",
        )
        == 0
    )
    run = run_dir(tmp_path)
    assert checkpoints(run) == ["best", "checkpoint_000003", "checkpoint_000004"]
    assert json.loads((run / "checkpoints" / "best" / "metadata.json").read_text())["iteration"] == 4
    params = json.loads((run / "params.json").read_text())
    assert (params["checkpoint_interval_s"], params["keep_checkpoints"], params["keep_best"]) == (
        1e-6,
        2,
        "timesteps_total",
    )
    defaults = cli.build_parser().parse_args(["train", "--algo", "pg", "--env", "CartPole-v1"])
    assert cli_args.checkpoint_settings(defaults) == {}  # RunSpec's defaults apply: 600 s, keep 5
    with pytest.raises(SystemExit):
        cli.main(["train", "--algo", "pg", "--env", "CartPole-v1", "--keep-checkpoints", "0"])
    assert "--keep-checkpoints: 0 must be >= 1" in capsys.readouterr().err


def test_ctrl_c_saves_a_checkpoint_and_exits_130(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, ray_session: None
) -> None:
    real_train = Trainer.train
    calls = []

    def train_until_interrupted(self: Trainer) -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_train(self)

    monkeypatch.setattr(Trainer, "train", train_until_interrupted)
    assert train(tmp_path, "--stop-iters", "5") == 130
    run = run_dir(tmp_path)
    assert checkpoints(run) == ["checkpoint_000001"]
    assert len(progress(run)) == 1
    captured = capsys.readouterr()
    assert "interrupted" in captured.out and str(run / "checkpoints" / "checkpoint_000001") in captured.out
    assert f"flowrl train --resume {run}" in captured.out
    assert "Traceback" not in captured.err


def test_an_env_error_leaves_an_emergency_checkpoint_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ray_session: None
) -> None:
    register_env("FaultyCartPole", FaultInjectEnv)
    # The driver samples (num_workers 0); 64 steps an iteration: step 150 is in iteration 3.
    faults = {"env": "CartPole-v1", "faults": [{"kind": "raise", "worker_indices": [0], "at_step": 150}]}
    argv = [
        "train",
        "--algo",
        "pg",
        "--env",
        "FaultyCartPole",
        "--results-dir",
        str(tmp_path),
        *TINY,
        "--set",
        f"env_config={json.dumps(faults)}",
        "--stop-iters",
        "5",
    ]
    assert cli.main(argv) == 1
    run = run_dir(tmp_path)
    assert checkpoints(run) == ["checkpoint_000002"] and len(progress(run)) == 2
    err = capsys.readouterr().err
    assert "flowrl: error: InjectedFault: injected fault 'raise#0'" in err
    assert f"saved a checkpoint of iteration 2 after the error: {run / 'checkpoints' / 'checkpoint_000002'}" in err
    assert f"resume with: flowrl train --resume {run}" in err


def test_an_error_with_a_broken_state_says_why_no_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, ray_session: None
) -> None:
    from flowrl.errors import NonFiniteUpdateError

    real_train = Trainer.train

    def train_then_fail(self: Trainer) -> dict[str, Any]:
        if self.iteration == 1:
            raise NonFiniteUpdateError("5 updates in a row had a non-finite loss")
        return real_train(self)

    monkeypatch.setattr(Trainer, "train", train_then_fail)
    monkeypatch.setattr(Trainer, "state_problem", lambda self: "policy 'default_policy' has non-finite weights in 'w'")
    assert train(tmp_path, "--stop-iters", "5") == 1
    err = capsys.readouterr().err
    assert "flowrl: error: 5 updates in a row had a non-finite loss" in err and "Traceback" not in err
    assert "no checkpoint written after the error: the trainer's state is not intact: policy 'default_policy'" in err
    assert "the last complete checkpoint is none" in err and "resume with" not in err
    assert checkpoints(run_dir(tmp_path)) == []


def send_at_call(n: int, signum: int, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make the ``n``-th call of ``Trainer.train`` send ``signum`` to this process (the handler interrupts it);
    returns the list that gets an item per call."""
    real_train = Trainer.train
    calls: list[int] = []

    def train_then_signal(self: Trainer) -> dict[str, Any]:
        calls.append(1)
        if len(calls) == n:
            os.kill(os.getpid(), signum)
        return real_train(self)

    monkeypatch.setattr(Trainer, "train", train_then_signal)
    return calls


def test_sighup_saves_a_checkpoint_and_exits_129(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    ray_session: None,
    sighup_default: None,
) -> None:
    send_at_call(3, signal.SIGHUP, monkeypatch)
    assert train(tmp_path, "--stop-iters", "5") == 129
    run = run_dir(tmp_path)
    assert checkpoints(run) == ["checkpoint_000002"]
    out = capsys.readouterr().out
    assert "interrupted (SIGHUP)" in out and f"flowrl train --resume {run}" in out


def test_a_second_signal_while_saving_exits_with_the_first_ones_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, ray_session: None
) -> None:
    calls = send_at_call(4, signal.SIGTERM, monkeypatch)  # iteration 3 is not saved yet
    real_save = Trainer.save

    def save_interrupted(self: Trainer, checkpoint_dir: Any, metadata: Any = None) -> str:
        if len(calls) == 4:  # Ctrl-C while the SIGTERM checkpoint is written: what Python's SIGINT handler raises
            raise KeyboardInterrupt
        return real_save(self, checkpoint_dir, metadata)

    monkeypatch.setattr(Trainer, "save", save_interrupted)
    assert train(tmp_path, "--stop-iters", "5", "--checkpoint-freq", "2") == 143
    run = run_dir(tmp_path)
    # The weights checkpoint written before the full state stays the latest (tests/runs/test_preemption.py).
    assert checkpoints(run) == ["checkpoint_000002", "checkpoint_000003"]
    err = capsys.readouterr().err
    assert (
        f"interrupted again while saving; the last complete checkpoint is {run / 'checkpoints' / 'checkpoint_000003'}"
        in err
    )


def test_a_run_on_a_storage_path_resumes_from_another_directory_and_home(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, ray_session: None
) -> None:
    storage = tmp_path / "shared"
    real_train = Trainer.train

    def interrupt_second_iteration(self: Trainer) -> dict[str, Any]:
        if self.iteration == 1:
            raise KeyboardInterrupt
        return real_train(self)

    monkeypatch.setattr(Trainer, "train", interrupt_second_iteration)
    argv = ["train", "--algo", "pg", "--env", "CartPole-v1", *TINY, "--storage-path", str(storage), "--stop-iters", "3"]
    assert cli.main(argv) == 130
    monkeypatch.setattr(Trainer, "train", real_train)
    run = run_dir(storage)
    assert json.loads((run / "params.json").read_text())["storage_path"] == str(storage)
    out = capsys.readouterr().out
    assert f"run directory: {run}\n" in out
    (resume_line,) = [line for line in out.splitlines() if line.startswith("resume with: ")]
    assert resume_line == f"resume with: flowrl train --resume {run}"

    # Another node: another working directory and home, and Ray of its own; the run found by its name.
    elsewhere, home = tmp_path / "elsewhere", tmp_path / "home"
    elsewhere.mkdir()
    home.mkdir()
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "HOME": str(home)}
    resume = [
        sys.executable,
        "-m",
        "flowrl.cli",
        "train",
        "--storage-path",
        str(storage),
        "--resume",
        run.name,
        "--stop-iters",
        "2",
    ]
    done = subprocess.run(resume, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "(iteration 1)" in done.stdout and "iter    2" in done.stdout and f"run directory: {run}\n" in done.stdout
    assert [r["training_iteration"] for r in progress(run)] == [1, 2]
    assert not any(elsewhere.iterdir())

    # The printed resume command works from elsewhere too, with no --storage-path: params.json has it.
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("HOME", str(home))
    assert cli.main([*shlex.split(resume_line.removeprefix("resume with: flowrl ")), "--stop-iters", "3"]) == 0
    assert [r["training_iteration"] for r in progress(run)] == [1, 2, 3]
    assert json.loads((run / "params.json").read_text())["storage_path"] == str(storage)
    assert not any(elsewhere.iterdir())


# --- errors a user can cause -------------------------------------------------------------------------


def error_of(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("flowrl: error: ") and "Traceback" not in err
    return err


def test_unknown_algorithm_suggests_the_closest(capsys: pytest.CaptureFixture[str]) -> None:
    err = error_of(capsys, ["train", "--algo", "ppp", "--env", "CartPole-v1"])
    assert "did you mean 'ppo'" in err and all(name in err for name in ("a2c", "a3c", "pg", "ppo"))
    assert len(err.strip().splitlines()) == 1


def test_unknown_env_suggests_the_closest(capsys: pytest.CaptureFixture[str]) -> None:
    err = error_of(capsys, ["train", "--algo", "pg", "--env", "CartPol-v1"])
    assert "did you mean 'CartPole-v1'" in err


def test_invalid_config_lists_every_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = error_of(
        capsys,
        [
            "train",
            "--algo",
            "pg",
            "--env",
            "CartPole-v1",
            "--results-dir",
            str(tmp_path),
            "--set",
            "lrr=0.1",
            "--set",
            "gamma=2",
            "--set",
            "model.fcnet_hidens=[8]",
        ],
    )
    assert "invalid config (3 problems)" in err
    assert "'lrr'; did you mean 'lr'" in err and "gamma=2" in err and "'fcnet_hiddens'" in err
    assert not any(tmp_path.iterdir())  # no run directory for a run that never started


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--set", "lr"], "is not key=value"),
        (["--set", "lr.x=1"], "lr is 0.004 (float), not a dict"),
        (["--config", "missing.yaml"], "no such file"),
        (["--config", "config.toml"], "use .yaml, .yml or .json"),
    ],
)
def test_bad_arguments(argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert expected in error_of(capsys, ["train", "--algo", "pg", "--env", "CartPole-v1", *argv])


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("bad.yaml", "config: {lr: 0.1\n", "is not valid YAML: expected ',' or '}'"),
        ("bad.json", '{"lr": }', "is not valid JSON: Expecting value at line 1, column 8"),
        ("list.yaml", "- 1\n- 2\n", "must hold a mapping"),
        ("stop.yaml", "stop: {training_iterations: 3}\n", "did you mean 'training_iteration'"),
        ("both.json", '{"lr": 0.1, "config": {"lr": 0.2}}', "both at the top level and under 'config'"),
    ],
)
def test_bad_config_files(
    tmp_path: Path, name: str, text: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / name).write_text(text)
    assert expected in error_of(
        capsys, ["train", "--algo", "pg", "--env", "CartPole-v1", "--config", str(tmp_path / name)]
    )


def test_missing_algo_and_unusable_resume(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "needs --algo" in error_of(capsys, ["train", "--env", "CartPole-v1"])
    assert "no params.json" in error_of(capsys, ["train", "--resume", str(tmp_path)])
    (tmp_path / "params.json").write_text(json.dumps({"algo": "pg", "env": "CartPole-v1", "config": {}}))
    assert "no checkpoint under" in error_of(capsys, ["train", "--resume", str(tmp_path)])
    assert "cannot be used with --resume" in error_of(capsys, ["train", "--resume", str(tmp_path), "--set", "lr=1"])
    assert "does not exist" in error_of(capsys, ["evaluate", str(tmp_path / "nowhere")])


def test_storage_path_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    new_run = ["train", "--algo", "pg", "--env", "CartPole-v1"]
    assert "storage path 'runs' is relative; it must be absolute" in error_of(
        capsys, [*new_run, "--storage-path", "runs"]
    )
    both = error_of(
        capsys, [*new_run, "--storage-path", str(tmp_path / "shared"), "--results-dir", str(tmp_path / "local")]
    )
    assert "--storage-path and --results-dir both say where run directories go: give one" in both
    assert not any(tmp_path.iterdir())
    (tmp_path / "pg_CartPole-v1_20261124-010203").mkdir()
    (tmp_path / "pg_CartPole-v1_20261124-010203" / "params.json").write_text("{}")
    err = error_of(capsys, ["train", "--storage-path", str(tmp_path), "--resume", "pg_CartPole-v1_20261124"])
    assert (
        f"no run directory 'pg_CartPole-v1_20261124' under storage path '{tmp_path}'; "
        f"the newest there: pg_CartPole-v1_20261124-010203"
    ) in err


def test_bad_flag_values_are_argparse_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["train", "--algo", "pg", "--env", "CartPole-v1", "--num-workers", "-1"])
    assert exc.value.code == 2
    assert "--num-workers: -1 must be >= 0" in capsys.readouterr().err


# --- config building (no Ray) ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1e-3", 1e-3),
        ("3", 3),
        ("true", True),
        ("False", False),
        ("null", None),
        ("[64, 64]", [64, 64]),
        ('{"a": 1}', {"a": 1}),
        ("relu", "relu"),
        ("CartPole-v1", "CartPole-v1"),
    ],
)
def test_set_values_parse_as_json_else_string(text: str, value: Any) -> None:
    assert cli_args.parse_value(text) == value and type(cli_args.parse_value(text)) is type(value)


def test_set_nested_keys_merge_into_dicts() -> None:
    assignments = cli_args.parse_set(["model.fcnet_hiddens=[64,64]", "env_config.a.b=2", "lr=0.01"])
    config = cli_args.apply_set({"model": {"fcnet_activation": "relu"}}, assignments, defaults={"model": {}, "lr": 1.0})
    assert config == {
        "model": {"fcnet_activation": "relu", "fcnet_hiddens": [64, 64]},
        "env_config": {"a": {"b": 2}},
        "lr": 0.01,
    }
    with pytest.raises(CLIError, match="not key=value"):
        cli_args.parse_set(["=3"])


def test_config_precedence(tmp_path: Path) -> None:
    file = tmp_path / "experiment.json"
    file.write_text(
        json.dumps(
            {
                "algo": "pg",
                "env": "CartPole-v1",
                "stop": {"timesteps_total": 1000},
                "config": {"lr": 0.01, "gamma": 0.9, "num_workers": 3, "seed": 1},
            }
        )
    )
    algorithm, env, config, stop = cli_args.train_settings(
        args_for(
            "--config",
            str(file),
            "--set",
            "lr=0.02",
            "--set",
            "num_workers=2",
            "--num-workers",
            "0",
            "--stop-iters",
            "4",
        )
    )
    assert (algorithm.name, env) == ("pg", "CartPole-v1")
    assert config["gamma"] == 0.9  # file over defaults
    assert config["lr"] == 0.02  # --set over file
    assert config["num_workers"] == 0 and config["seed"] == 1  # flags over --set; file kept where no flag
    assert "train_batch_size" not in config  # the algorithm default stays a default
    assert stop == {"timesteps_total": 1000, "training_iteration": 4}
    _, env, config, _ = cli_args.train_settings(args_for("--config", str(file), "--env", "Pendulum-v1", "--seed", "7"))
    assert env == "Pendulum-v1" and config["seed"] == 7


def test_yaml_flat_layout_and_scientific_floats(tmp_path: Path) -> None:
    file = tmp_path / "flat.yml"
    file.write_text("lr: 5e-5\ngamma: 0.95\nmodel:\n  fcnet_hiddens: [32, 32]\n")
    experiment = load_experiment_file(file)
    assert experiment == {
        "algo": None,
        "env": None,
        "stop": {},
        "config": {"lr": 5e-5, "gamma": 0.95, "model": {"fcnet_hiddens": [32, 32]}},
    }


def test_results_are_made_json_safe() -> None:
    result = {
        "nan": float("nan"),
        "inf": float("inf"),
        "f32": np.float32(0.5),
        "i64": np.int64(3),
        "array": np.arange(3),
        "nested": {"tuple": (1, np.bool_(True))},
        7: "int key",
    }
    safe = json_safe(result)
    assert safe == {
        "nan": None,
        "inf": None,
        "f32": 0.5,
        "i64": 3,
        "array": [0, 1, 2],
        "nested": {"tuple": [1, True]},
        "7": "int key",
    }
    json.dumps(safe, allow_nan=False)
    assert not any(isinstance(v, float) and math.isnan(v) for v in safe.values())


# --- list, plan, evaluate ----------------------------------------------------------------------------


def test_list_algorithms(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [line.split()[0] for line in lines]
    assert {"pg", "a2c", "a3c", "ppo"} <= set(names)
    assert any(line.startswith("pg") and "policy gradient" in line for line in lines)
    assert cli.main(["list", "pg"]) == 0
    assert "train_batch_size" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ("text", ["plan ppo:", "TrainOneStep", "RolloutWorker"]),
        ("mermaid", ["flowchart TD", "TrainOneStep", "RolloutWorker"]),
        ("dot", ["digraph", "TrainOneStep", "RolloutWorker", "->"]),
    ],
)
def test_plan_prints_the_graph(
    fmt: str, expected: list[str], capsys: pytest.CaptureFixture[str], ray_session: None
) -> None:
    argv = [
        "plan",
        "--algo",
        "ppo",
        "--env",
        "CartPole-v1",
        "--format",
        fmt,
        "--num-workers",
        "1",
        "--set",
        "num_cpus_per_worker=0.25",
        "--set",
        "train_batch_size=64",
        "--set",
        "sgd_minibatch_size=32",
    ]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    for text in expected:
        assert text in out


def test_evaluate_a_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str], ray_session: None) -> None:
    assert train(tmp_path, "--stop-iters", "1") == 0
    run = run_dir(tmp_path)
    capsys.readouterr()
    assert cli.main(["evaluate", str(run / "checkpoints" / "checkpoint_000001"), "--episodes", "2", "--seed", "0"]) == 0
    out = capsys.readouterr().out
    assert "2 episodes, deterministic actions" in out
    mean = float(out.split("episode_reward_mean ")[1].split()[0])
    assert 1 <= mean <= 500
    # A run directory stands for its latest checkpoint.
    moved = tmp_path / "copy"
    shutil.copytree(run, moved)
    assert cli.main(["evaluate", str(moved), "--episodes", "1"]) == 0
    assert "checkpoint_000001" in capsys.readouterr().out


SMALL_ASYNC = ["--num-workers", "2", "--set", "num_cpus_per_worker=0.1", "--set", "rollout_fragment_length=10"]
SMALL_IMPALA = ["--set", "num_envs_per_worker=2", "--set", "train_batch_size=40"]


@pytest.mark.parametrize(
    ("algo", "env", "extra", "expected"),
    [
        (
            "impala",
            "CartPole-v1",
            [*SMALL_IMPALA, "--set", "num_aggregation_workers=1", "--set", "num_cpus_per_aggregator=0.1"],
            [
                "gather_async(aggregators)",
                "AggregatorWorker",
                "RolloutWorker x2",
                "LearnerThread",
                "RolloutWorker x2 --gather_async--> AggregatorWorker",
                "AggregatorWorker --forward weights--> RolloutWorker x2",
            ],
        ),
        (
            "appo",
            "CartPole-v1",
            SMALL_IMPALA,
            ["transform(Enqueue)", "LearnerThread", "for_each(UpdateTargetNetwork)", "for_each(UpdateKL)"],
        ),
        (
            "ppo_dqn",
            "MultiAgentCartPole",
            ["--set", "ppo.train_batch_size=40", "--set", "ppo.sgd_minibatch_size=20"],
            [
                "duplicate[0]",
                "for_each(SelectExperiences)",
                "for_each(StoreToReplayBuffer)",
                "replay",
                "for_each(UpdateKL)",
                "union[async]",
            ],
        ),
        (
            "es",
            "CartPole-v1",
            ["--set", "noise_table_size=100000"],
            [
                "batch_across_shards(rollout_workers.transform())",
                "combine(CollectPerturbations)",
                "for_each(ESUpdate)",
                "for_each(BroadcastWeights)",
                "RolloutWorker x2",
            ],
        ),
        (
            "ars",
            "CartPole-v1",
            ["--set", "noise_table_size=100000"],
            [
                "combine(CollectPerturbations)",
                "for_each(ARSUpdate)",
                "for_each(UpdateObservationFilter)",
                "for_each(BroadcastWeights)",
            ],
        ),
    ],
)
def test_plan_shows_each_algorithms_graph(
    algo: str, env: str, extra: list[str], expected: list[str], capsys: pytest.CaptureFixture[str], ray_session: None
) -> None:
    assert cli.main(["plan", "--algo", algo, "--env", env, *SMALL_ASYNC, *extra]) == 0
    out = capsys.readouterr().out
    for text in expected:
        assert text in out, (text, out)
