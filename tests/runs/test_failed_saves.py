"""A periodic save that fails never ends a run (counted in ``num_failed_checkpoints``), and a run warns at start when
its checkpoints will not fit on the disk: DQN with a local replay buffer, in this process."""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from fakes import progress

import flowrl.storage.checkpoints as checkpoint_files
from flowrl.errors import ReplayShardError, RunWarning
from flowrl.runs.resume import find_resume_point, resume_run
from flowrl.runs.run import start_run
from flowrl.runs.saving import check_disk_space, estimate_checkpoint_bytes
from flowrl.storage.checkpoints import read_checkpoint, write_checkpoint
from flowrl.storage.rundir import RunSpec

pytestmark = pytest.mark.unit

# One process, a few milliseconds an iteration; checkpoints keep the replay buffer's contents.
DQN = {
    "num_workers": 0,
    "rollout_fragment_length": 16,
    "train_batch_size": 16,
    "learning_starts": 32,
    "buffer_size": 1000,
    "model": {"fcnet_hiddens": [16]},
    "store_buffer_in_checkpoints": True,
    "seed": 0,
}


def entries(run_dir: Path) -> list[str]:
    """Everything in the run's checkpoints directory, hidden work in progress included."""
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


def test_a_full_disk_fails_one_periodic_save_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = checkpoint_files._write_file
    states: list[Path] = []

    def write_file(path: Path, data: bytes) -> None:
        if path.name == checkpoint_files.STATE_FILE:
            states.append(path)
            if len(states) == 2:  # the second save: half of state.pkl is written, then the disk is full
                path.write_bytes(data[: len(data) // 2])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write(path, data)

    monkeypatch.setattr(checkpoint_files, "_write_file", write_file)
    seen: dict[int, list[str]] = {}
    spec = RunSpec("dqn", "CartPole-v1", DQN, stop={"training_iteration": 4}, checkpoint_freq=1, keep_checkpoints=1)
    with start_run(spec, results_dir=tmp_path) as run:
        with pytest.warns(RunWarning) as warned:
            summary = run.train(
                on_result=lambda result: seen.setdefault(result["training_iteration"], entries(run.directory))
            )
        results = [r["num_failed_checkpoints"] for r in progress(run.directory)]
    failures = [str(w.message) for w in warned if "failed" in str(w.message)]
    assert failures == [
        f"saving the checkpoint of iteration 2 failed (OSError: [Errno {errno.ENOSPC}] {os.strerror(errno.ENOSPC)}); "
        f"training goes on and the latest checkpoint is still {run.directory / 'checkpoints' / 'checkpoint_000001'} "
        "(num_failed_checkpoints=1)"
    ]
    # Counted from the iteration after the failed save; the state saved after it keeps the count.
    assert results == [0, 0, 1, 1] and run.trainer.num_failed_checkpoints == 1
    # Before iteration 3's save: rotation deleted nothing after the failure, and the write left nothing behind.
    assert seen[3] == ["checkpoint_000001"]
    assert seen[4] == ["checkpoint_000003"]  # the next save succeeded, and rotation went on
    assert summary.checkpoint == run.directory / "checkpoints" / "checkpoint_000004" and run.failure is None
    state, _ = read_checkpoint(summary.checkpoint)
    assert state["num_failed_checkpoints"] == 1

    # A resumed run goes on counting from the checkpoint's count.
    point = find_resume_point(run.directory, stop={"training_iteration": 5})
    with resume_run(point) as resumed:
        assert resumed.trainer.num_failed_checkpoints == 1
        resumed.train()
    assert [r["num_failed_checkpoints"] for r in progress(run.directory)][-1] == 1


def test_a_replay_timeout_while_gathering_state_fails_the_save_not_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = RunSpec("dqn", "CartPole-v1", DQN, stop={"training_iteration": 3}, checkpoint_freq=1)
    with start_run(spec, results_dir=tmp_path) as run:
        real_get_state = run.trainer.get_state

        def get_state(**kwargs: Any) -> dict[str, Any]:  # save asks for it without the replay rows: replay=False
            if run.trainer.iteration == 1:
                raise ReplayShardError("replay shard 0 gave no state within 60 s")
            return real_get_state(**kwargs)

        monkeypatch.setattr(run.trainer, "get_state", get_state)
        with pytest.warns(RunWarning, match=re.escape("(ReplayShardError: replay shard 0 gave no state within 60 s)")):
            summary = run.train()
    assert [r["num_failed_checkpoints"] for r in progress(run.directory)] == [0, 1, 1]
    assert entries(run.directory) == ["checkpoint_000002", "checkpoint_000003"]
    assert summary.stop_reason is not None and run.failure is None


class Usage(NamedTuple):
    total: int
    used: int
    free: int


def test_checkpoints_that_will_not_fit_on_the_disk_are_a_warning_with_the_arithmetic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A previous checkpoint's size: 3 MB of state, kept 2 + 1 being written = 9 MB; 1 MB free + 3 MB already there.
    checkpoints = tmp_path / "checkpoints"
    write_checkpoint(checkpoints / "checkpoint_000007", {"blob": b"x" * 3_000_000}, {"iteration": 7})
    size = sum(f.stat().st_size for f in (checkpoints / "checkpoint_000007").iterdir())
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 10**12 - 1_000_000, 1_000_000))
    trainer: Any = None  # not asked: the previous checkpoint's size is the estimate
    with pytest.warns(RunWarning) as warned:
        check_disk_space(tmp_path, trainer, keep=2)
    (message,) = [str(w.message) for w in warned]
    each = f"{size / 1e6:.1f} MB"
    assert message.startswith(
        f"the run's checkpoints may not fit on the disk of {str(tmp_path)!r}: keep_checkpoints=2 + 1 being written = "
        f"3 x {each} (the size of checkpoint_000007) = {3 * size / 1e6:.1f} MB, but the disk has 1.0 MB free plus "
        f"the {each} of the run's checkpoints already there."
    )
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 0, 3 * size - size))
    check_disk_space(tmp_path, trainer, keep=2)  # it fits exactly: no warning (pytest fails on an unexpected one)


def test_a_new_run_estimates_its_checkpoints_from_the_weights_and_the_replay_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = RunSpec("dqn", "CartPole-v1", DQN, stop={"training_iteration": 1}, keep_checkpoints=4)
    with start_run(spec, results_dir=tmp_path) as run:
        policy = run.trainer.workers.local_worker().get_policy("default_policy")
        weights = sum(w.nbytes for w in policy.get_weights().values())
        # CartPole: 4 float32 per observation, two a row, 64 bytes for the rest of the row, 1000 rows.
        estimate = estimate_checkpoint_bytes(run.trainer)
        assert estimate == 4 * weights + 1000 * (2 * 4 * 4 + 64)
        monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**9, 10**9, estimate * 5 - 1))
        with pytest.warns(RunWarning, match=re.escape("keep_checkpoints=4 + 1 being written = 5 x")):
            run.train()


# Ape-X with two replay shards whose rows every checkpoint streams to its files.
APEX = {
    "num_workers": 1,
    "num_cpus_per_worker": 0.25,
    "num_replay_shards": 2,
    "rollout_fragment_length": 20,
    "learning_starts": 100,
    "train_batch_size": 16,
    "timesteps_per_iteration": 200,
    "store_buffer_in_checkpoints": True,
    "seed": 0,
}


@pytest.mark.timeout(300)
def test_apex_goes_on_after_a_full_disk_with_its_shards_rows_staged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ray_session: None
) -> None:
    real_write = checkpoint_files._write_file
    states: list[Path] = []

    def write_file(path: Path, data: bytes) -> None:
        if path.name == checkpoint_files.STATE_FILE:
            states.append(path)
            if len(states) == 2:  # the second save: the shards have streamed their rows, then the disk is full
                staged = {p.name.split(".")[0] for p in path.parent.glob("*.npy")}
                assert staged == {"replay_shard_0", "replay_shard_1"}
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write(path, data)

    monkeypatch.setattr(checkpoint_files, "_write_file", write_file)
    seen: dict[int, list[str]] = {}
    spec = RunSpec("apex", "CartPole-v1", APEX, stop={"training_iteration": 4}, checkpoint_freq=1, keep_checkpoints=1)
    with start_run(spec, results_dir=tmp_path) as run:
        with pytest.warns(RunWarning, match="saving the checkpoint of iteration 2 failed"):
            summary = run.train(
                on_result=lambda result: seen.setdefault(result["training_iteration"], entries(run.directory))
            )
    assert [r["num_failed_checkpoints"] for r in progress(run.directory)] == [0, 0, 1, 1]
    assert seen[3] == ["checkpoint_000001"]  # nothing rotated away, no staged shard files left behind
    assert seen[4] == ["checkpoint_000003"] and summary.checkpoint is not None and run.failure is None
    written = sorted({p.name.split(".")[0] for p in summary.checkpoint.glob("*.npy")})
    assert written == ["replay_shard_0", "replay_shard_1"]  # the next save streamed both shards' rows
