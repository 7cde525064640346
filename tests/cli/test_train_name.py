"""``flowrl train --name NAME --resume-if-exists`` and ``--umask``, run in-process with tiny PG configs."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import checkpoints, progress

from flowrl.cli import main as cli

pytestmark = pytest.mark.unit

# One process, two tiny SGD batches per run: each training iteration takes milliseconds.
TINY = ["--num-workers", "0", "--set", "train_batch_size=64", "--set", "rollout_fragment_length=32"]


def train(results: Path, *extra: str) -> int:
    return cli.main(["train", "--algo", "pg", "--env", "CartPole-v1", "--results-dir", str(results), *TINY, *extra])


@pytest.fixture
def umask_022() -> Iterator[None]:
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def test_resume_if_exists_continues_the_run_of_that_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    command = ("--name", "apex1", "--resume-if-exists", "--seed", "1", "--stop-iters", "2")
    assert train(tmp_path, *command) == 0
    run = tmp_path / "apex1"
    assert checkpoints(run) == ["checkpoint_000002"]
    capsys.readouterr()
    # The same command, resubmitted with a larger stop: it goes on from the checkpoint, in the same directory.
    assert train(tmp_path, *command[:-1], "4") == 0
    out = capsys.readouterr().out
    assert "resuming pg on CartPole-v1 from " in out and "(iteration 2)" in out
    assert [r["training_iteration"] for r in progress(run)] == [1, 2, 3, 4]
    assert [p.name for p in tmp_path.iterdir()] == ["apex1"]
    assert json.loads((run / "params.json").read_text())["stop"] == {"training_iteration": 4}
    # Run again once more: the run already meets its stop criterion.
    assert train(tmp_path, *command[:-1], "4") == 0
    assert "nothing to do" in capsys.readouterr().out


def test_name_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def error(*extra: str) -> str:
        assert train(tmp_path, "--stop-iters", "1", *extra) == 2
        return capsys.readouterr().err

    assert "--resume-if-exists needs --name NAME" in error("--resume-if-exists")
    assert "--name names a new run's directory; --resume continues" in error("--name", "x", "--resume", "y")
    assert "cannot name a run directory" in error("--name", "../x")
    assert train(tmp_path, "--stop-iters", "1", "--name", "taken") == 0
    err = error("--name", "taken")
    assert "already exists; a run is never overwritten" in err and "--resume-if-exists" in err
    err = error("--name", "taken", "--resume-if-exists", "--set", "lr=0.5")
    assert "the flags give lr=0.5 (the run's: " in err and "a resumed run keeps its config" in err
    assert "differs from the run's algo pg" in cli_error(tmp_path, capsys, "--name", "taken", "--resume-if-exists")
    assert "is not a umask" in argparse_error(capsys, "--umask", "999")
    assert [r["training_iteration"] for r in progress(tmp_path / "taken")] == [1]


def cli_error(results: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    argv = ["train", "--algo", "ppo", "--env", "CartPole-v1", "--results-dir", str(results), *TINY, *extra]
    assert cli.main(argv) == 2
    return capsys.readouterr().err


def argparse_error(capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    with pytest.raises(SystemExit) as exited:
        cli.main(["train", "--algo", "pg", "--env", "CartPole-v1", *extra])
    assert exited.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(("flags", "dir_mode", "file_mode"), [((), 0o700, 0o600), (("--umask", "022"), 0o755, 0o644)])
def test_run_directories_are_private_unless_umask_says_otherwise(
    tmp_path: Path, umask_022: None, flags: tuple[str, ...], dir_mode: int, file_mode: int
) -> None:
    assert train(tmp_path, "--stop-iters", "1", "--name", "r", *flags, "-q") == 0
    assert train(tmp_path, "--stop-iters", "2", "--name", "r", "--resume-if-exists", *flags, "-q") == 0
    run = tmp_path / "r"
    assert checkpoints(run) == ["checkpoint_000001", "checkpoint_000002"]
    paths = [run, *run.rglob("*")]
    assert {stat.S_IMODE(p.stat().st_mode) for p in paths if p.is_dir()} == {dir_mode}
    assert {stat.S_IMODE(p.stat().st_mode) for p in paths if p.is_file()} == {file_mode}
    assert os.umask(0o022) == 0o022  # the process's umask is back
