"""A run holds its directory's lock, names its directory when asked, and writes it privately."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes import checkpoints, progress

from flowrl.errors import RunError, RunWarning
from flowrl.runs.resume import find_resume_point, resume_run
from flowrl.runs.run import start_run
from flowrl.storage.lock import LOCK_FILE, RunLockedError, read_lock
from flowrl.storage.rundir import RunSpec, applied_umask, parse_umask

pytestmark = pytest.mark.unit

# One process, two tiny SGD batches per iteration: each training iteration takes milliseconds.
TINY = {"num_workers": 0, "train_batch_size": 64, "rollout_fragment_length": 32, "seed": 0}


def spec(iterations: int) -> RunSpec:
    return RunSpec("PG", "CartPole-v1", TINY, stop={"training_iteration": iterations})


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The process umask most systems give: files 0644, directories 0755 unless flowrl says otherwise."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def modes(directory: Path) -> tuple[set[int], set[int]]:
    """The permission bits of every directory (``directory`` included) and of every file under ``directory``."""
    dirs, files = {stat.S_IMODE(directory.stat().st_mode)}, set()
    for root, dirnames, filenames in os.walk(directory):
        dirs |= {stat.S_IMODE(os.stat(os.path.join(root, d)).st_mode) for d in dirnames}
        files |= {stat.S_IMODE(os.stat(os.path.join(root, f)).st_mode) for f in filenames}
    return dirs, files


def test_a_run_holds_its_lock_until_it_closes(tmp_path: Path) -> None:
    with start_run(spec(2), results_dir=tmp_path) as run:
        owner = read_lock(run.directory)
        assert owner is not None and owner.pid == os.getpid() and run.lock is not None
        run.train()
        point = find_resume_point(run.directory, stop={"training_iteration": 3})  # readers need no lock
        with pytest.raises(RunLockedError, match=rf"is in use by another driver \(pid {os.getpid()} on host "):
            resume_run(point)
    assert not (run.directory / LOCK_FILE).exists()
    with resume_run(point) as resumed:
        assert resumed.lock is not None and read_lock(run.directory) == resumed.lock.owner
        resumed.train()
    assert not (run.directory / LOCK_FILE).exists()
    assert [r["training_iteration"] for r in progress(run.directory)] == [1, 2, 3]


def test_the_lock_is_released_when_training_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flowrl.engine.trainer import Trainer

    def fail(self: Trainer) -> dict[str, Any]:
        raise ZeroDivisionError("boom")

    with start_run(spec(2), results_dir=tmp_path) as run:
        monkeypatch.setattr(Trainer, "train", fail)
        with pytest.raises(ZeroDivisionError):
            run.train()
    assert not (run.directory / LOCK_FILE).exists()


def test_a_run_whose_lock_was_taken_over_stops_without_writing(tmp_path: Path) -> None:
    with start_run(spec(5), results_dir=tmp_path) as run:
        assert run.lock is not None
        run.lock.lost = True  # what the heartbeat finds when another driver took the lock over
        with pytest.raises(RunLockedError, match="another driver took its lock over"):
            run.train()
        assert run.failure is not None and not run.failure.saved
        assert "another driver took the run directory over" in (run.failure.not_saved_because or "")
    assert progress(run.directory) == [] and checkpoints(run.directory) == []


def test_a_run_directory_is_private_whatever_the_umask(tmp_path: Path, umask_022: None) -> None:
    with start_run(spec(2), results_dir=tmp_path, name="private") as run:
        assert os.umask(0o022) == 0o022  # outside train(), the process keeps its own umask
        run.train()
    assert run.directory == tmp_path / "private" and checkpoints(run.directory) == ["checkpoint_000002"]
    dirs, files = modes(run.directory)
    assert dirs == {0o700} and files == {0o600}
    assert len(files) > 0 and os.umask(0o022) == 0o022  # restored after the run


def test_a_run_directory_follows_the_umask_given(tmp_path: Path, umask_022: None) -> None:
    os.umask(0o077)
    with start_run(spec(1), results_dir=tmp_path, umask=0o022) as run:
        run.train()
    dirs, files = modes(run.directory)
    assert dirs == {0o755} and files == {0o644}
    assert os.umask(0o022) == 0o077


def test_a_named_run_is_never_overwritten(tmp_path: Path) -> None:
    with start_run(spec(1), results_dir=tmp_path, name="apex1") as run:
        run.train()
    for restart in (False, True):
        with pytest.raises(
            RunError, match=r"already exists; a run is never overwritten: resume it .*--resume-if-exists"
        ):
            start_run(spec(1), results_dir=tmp_path, name="apex1", restart_unfinished=restart)
    assert checkpoints(tmp_path / "apex1") == ["checkpoint_000001"]
    assert not (tmp_path / "apex1" / LOCK_FILE).exists()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(RunError, match="is not a flowrl run directory"):
        start_run(spec(1), results_dir=tmp_path, name="mine", restart_unfinished=True)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    with pytest.raises(RunError, match="run name 'a/b' cannot name a run directory"):
        start_run(spec(1), results_dir=tmp_path, name="a/b")


def test_a_named_run_that_ended_before_its_first_checkpoint_starts_again(tmp_path: Path) -> None:
    with start_run(spec(1), results_dir=tmp_path, name="early"):
        pass  # ended (say, killed) before any iteration
    assert (tmp_path / "early" / "params.json").is_file()
    with pytest.warns(RunWarning, match="holds no checkpoint .*starting it again"):
        run = start_run(spec(2), results_dir=tmp_path, name="early", restart_unfinished=True)
    with run:
        run.train()
    assert [r["training_iteration"] for r in progress(run.directory)] == [1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["early"]


def test_umask_values() -> None:
    assert parse_umask("022") == 0o022 and parse_umask("0o077") == 0o077 and parse_umask("7") == 0o007
    for bad in ("", "8", "1000", "rw"):
        with pytest.raises(ValueError, match="is not a umask"):
            parse_umask(bad)
    before = os.umask(0o027)
    try:
        with applied_umask(0o077):
            assert os.umask(0o077) == 0o077
        with applied_umask(None):
            assert os.umask(0o027) == 0o027
        assert os.umask(0o027) == 0o027
    finally:
        os.umask(before)
