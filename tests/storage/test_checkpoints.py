"""Checkpoints on disk: round trips, integrity checks, ordering, rotation, copies, and writes killed at every step."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

import flowrl.storage.checkpoints
from flowrl.errors import CheckpointError, ConfigError
from flowrl.storage.checkpoints import (
    COMPLETE_FILE,
    METADATA_FILE,
    STATE_FILE,
    clean_orphans,
    copy_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    prune_checkpoints,
    read_checkpoint,
    read_metadata,
    verify_checkpoint,
    write_checkpoint,
)
from flowrl.storage.versions import runtime_versions

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
FILES = {"policies.safetensors": b"\x00\x01weights" * 100, "policies.json": b'{"format": "flowrl-policies"}'}


def save(path: Path, value: str, iteration: int = 1, files: dict[str, bytes] | None = None) -> Path:
    return write_checkpoint(path, {"value": value}, {"iteration": iteration}, files=files)


def hidden(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def write_legacy(path: Path, value: str) -> Path:
    """A checkpoint as flowrl wrote it before the completion marker: no COMPLETE, no "format" key."""
    path.mkdir(parents=True)
    (path / STATE_FILE).write_bytes(cloudpickle.dumps({"value": value}))
    (path / METADATA_FILE).write_text(json.dumps({"algo": "ppo", "iteration": 7}))
    return path


# --- writing and reading -------------------------------------------------------------------------------


def test_a_round_trip_keeps_state_metadata_and_extra_files(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "checkpoint_000001", {"value": [1, 2]}, {"iteration": 1}, files=FILES)
    assert path == tmp_path / "checkpoint_000001"
    state, metadata = read_checkpoint(path)
    assert state == {"value": [1, 2]}
    assert metadata == {"iteration": 1, "versions": runtime_versions(), "format": 3}
    assert read_metadata(path) == metadata
    for name, data in FILES.items():
        assert (path / name).read_bytes() == data
    marker = json.loads((path / COMPLETE_FILE).read_text())
    assert sorted(marker["files"]) == sorted([STATE_FILE, METADATA_FILE, *FILES])
    for name, entry in marker["files"].items():
        data = (path / name).read_bytes()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    verify_checkpoint(path)
    assert hidden(tmp_path) == []


def test_extra_files_cannot_take_reserved_or_nested_names(tmp_path: Path) -> None:
    for name in (STATE_FILE, COMPLETE_FILE, "sub/file", ".."):
        with pytest.raises(ValueError, match="cannot be used"):
            save(tmp_path / "checkpoint_000001", "x", files={name: b""})
    assert list(tmp_path.iterdir()) == []


def test_a_directory_without_its_marker_is_incomplete(tmp_path: Path) -> None:
    path = save(tmp_path / "checkpoint_000001", "x", files=FILES)
    (path / COMPLETE_FILE).unlink()
    message = r"is incomplete \(no COMPLETE marker: the write was cut short\)"
    for check in (read_checkpoint, verify_checkpoint):
        with pytest.raises(CheckpointError, match=message) as info:
            check(path)
        assert str(path) in str(info.value)
    assert list_checkpoints(tmp_path) == [] and latest_checkpoint(tmp_path) is None


def test_a_flipped_byte_is_corrupt(tmp_path: Path) -> None:
    path = save(tmp_path / "checkpoint_000001", "x" * 1000, files=FILES)
    flip_a_byte(path / STATE_FILE)
    with pytest.raises(CheckpointError, match=r"is corrupt: state.pkl does not match its SHA-256") as info:
        read_checkpoint(path)
    assert str(path) in str(info.value)
    with pytest.raises(CheckpointError, match="corrupt: state.pkl"):
        verify_checkpoint(path)
    assert list_checkpoints(tmp_path) == [path]  # listed (its marker is there): verify_checkpoint tells it apart


def test_missing_or_truncated_files_are_named(tmp_path: Path) -> None:
    path = save(tmp_path / "checkpoint_000001", "x", files=FILES)
    data = (path / "policies.safetensors").read_bytes()
    (path / "policies.safetensors").write_bytes(data[:10])
    with pytest.raises(
        CheckpointError, match=rf"corrupt: policies.safetensors has 10 bytes, COMPLETE lists {len(data)}"
    ):
        verify_checkpoint(path)
    (path / METADATA_FILE).unlink()
    with pytest.raises(CheckpointError, match="corrupt: metadata.json is missing"):
        read_checkpoint(path)
    with pytest.raises(CheckpointError, match="metadata.json is missing"):
        read_metadata(path)
    (path / COMPLETE_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match="corrupt: its COMPLETE marker is unreadable"):
        verify_checkpoint(path)
    with pytest.raises(CheckpointError, match="does not exist"):
        read_checkpoint(tmp_path / "nowhere")


def test_a_checkpoint_older_than_the_marker_still_reads(tmp_path: Path) -> None:
    path = write_legacy(tmp_path / "checkpoint_000007", "legacy")
    verify_checkpoint(path)
    assert read_checkpoint(path) == ({"value": "legacy"}, {"algo": "ppo", "iteration": 7})
    assert latest_checkpoint(tmp_path) == path
    (path / STATE_FILE).unlink()
    with pytest.raises(CheckpointError, match="incomplete: state.pkl is missing"):
        verify_checkpoint(path)


def test_a_failed_write_keeps_the_previous_checkpoint_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = save(tmp_path / "checkpoint_000001", "old", files=FILES)
    real_write = flowrl.storage.checkpoints._write_file
    calls: list[Path] = []

    def fails_on_the_third_file(p: Path, data: bytes) -> None:
        calls.append(p)
        if len(calls) == 3:
            raise OSError("disk full")
        real_write(p, data)

    monkeypatch.setattr(flowrl.storage.checkpoints, "_write_file", fails_on_the_third_file)
    with pytest.raises(OSError, match="disk full"):
        save(path, "new", files=FILES)
    assert read_checkpoint(path)[0] == {"value": "old"}
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_an_overwrite_replaces_the_files(tmp_path: Path) -> None:
    path = save(tmp_path / "checkpoint_000001", "old", files=FILES)
    save(path, "new")
    assert read_checkpoint(path)[0] == {"value": "new"}
    assert sorted(p.name for p in path.iterdir()) == sorted([COMPLETE_FILE, METADATA_FILE, STATE_FILE])
    assert hidden(tmp_path) == []


# --- the checkpoints of a directory ------------------------------------------------------------------------


def test_latest_is_by_iteration_number_and_ignores_other_names(tmp_path: Path) -> None:
    a = save(tmp_path / "checkpoint_999999", "a", 999999)
    b = save(tmp_path / "checkpoint_1000000", "b", 1000000)
    save(tmp_path / "best", "best", 5000000)
    save(tmp_path / "checkpoint_abc", "junk")
    save(tmp_path / "checkpoint_00000x", "junk")
    (tmp_path / "checkpoint_4000000").write_text("a file, not a directory")
    incomplete = save(tmp_path / "checkpoint_3000000", "cut short")
    (incomplete / COMPLETE_FILE).unlink()
    in_progress = save(tmp_path / "in-progress", "tmp")
    in_progress.rename(tmp_path / ".checkpoint_2000000.tmp-0123abcd")
    assert list_checkpoints(tmp_path) == [a, b]
    assert latest_checkpoint(tmp_path) == b
    assert latest_checkpoint(tmp_path / "nowhere") is None and list_checkpoints(tmp_path / "nowhere") == []


def test_a_lookup_puts_back_a_checkpoint_an_interrupted_overwrite_left_aside(tmp_path: Path) -> None:
    path = save(tmp_path / "checkpoint_000005", "old", 5, files=FILES)
    path.rename(tmp_path / ".checkpoint_000005.old-0123abcd")  # killed between the swap's two renames
    assert latest_checkpoint(tmp_path) == path
    assert read_checkpoint(path)[0] == {"value": "old"}
    assert hidden(tmp_path) == []


def test_a_half_deleted_copy_is_never_put_back(tmp_path: Path) -> None:
    path = save(tmp_path / "checkpoint_000005", "old", 5, files=FILES)
    (path / STATE_FILE).unlink()  # rmtree killed part way
    aside = tmp_path / ".checkpoint_000005.old-0123abcd"
    path.rename(aside)
    assert latest_checkpoint(tmp_path) is None
    assert clean_orphans(tmp_path) == [aside]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(sys.platform == "win32", reason="no directory locks on Windows")
def test_a_lookup_leaves_a_busy_directory_alone(tmp_path: Path) -> None:
    path = save(tmp_path / "checkpoint_000005", "old", 5)
    path.rename(tmp_path / ".checkpoint_000005.old-0123abcd")
    with flowrl.storage.checkpoints._locked(tmp_path):  # a writer in the middle of its swap
        assert list_checkpoints(tmp_path) == []
        assert hidden(tmp_path) == [".checkpoint_000005.old-0123abcd"]
    assert list_checkpoints(tmp_path) == [path]


def test_clean_orphans_removes_leftovers_and_reports_them(tmp_path: Path) -> None:
    live = save(tmp_path / "checkpoint_000002", "live", 2)
    leftovers = []
    for name in (
        ".checkpoint_000003.tmp-0a1b2c3d",
        ".checkpoint_000002.old-0a1b2c3d",
        ".checkpoint_000001.deleting-0a1b2c3d",
    ):
        save(tmp_path / "elsewhere" / "x", "leftover").rename(tmp_path / name)
        leftovers.append(tmp_path / name)
    (tmp_path / ".checkpoint_000004.tmp-00ff00ff").mkdir()  # killed right after making it
    leftovers.append(tmp_path / ".checkpoint_000004.tmp-00ff00ff")
    (tmp_path / ".hidden-but-not-ours").mkdir()
    assert sorted(clean_orphans(tmp_path)) == sorted(leftovers)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hidden-but-not-ours", live.name, "elsewhere"]
    assert read_checkpoint(live)[0] == {"value": "live"}


def test_prune_keeps_the_newest_the_protected_and_best(tmp_path: Path) -> None:
    saved = [save(tmp_path / f"checkpoint_{i:06d}", str(i), i) for i in (8, 9, 10, 11, 12)]
    best = copy_checkpoint(saved[0], tmp_path / "best")
    assert prune_checkpoints(tmp_path, keep=3) == saved[:2]
    assert list_checkpoints(tmp_path) == saved[2:]
    assert read_checkpoint(best)[0] == {"value": "8"}  # the hard links outlive the pruned original
    more = [save(tmp_path / f"checkpoint_{i:06d}", str(i), i) for i in (13, 14)]
    assert prune_checkpoints(tmp_path, keep=2, protect=[tmp_path / "sub" / ".." / saved[2].name]) == saved[3:]
    assert list_checkpoints(tmp_path) == [saved[2], *more]
    assert (tmp_path / "best").is_dir() and hidden(tmp_path) == []
    assert prune_checkpoints(tmp_path / "nowhere", keep=1) == []


@pytest.mark.parametrize("keep", [0, -1, True])
def test_prune_refuses_to_keep_nothing(tmp_path: Path, keep: Any) -> None:
    save(tmp_path / "checkpoint_000001", "x")
    with pytest.raises(ConfigError, match=rf"keep={keep!r}"):
        prune_checkpoints(tmp_path, keep=keep)
    assert len(list_checkpoints(tmp_path)) == 1


def test_copy_makes_a_complete_checkpoint_and_replaces_the_old_copy(tmp_path: Path) -> None:
    first = save(tmp_path / "checkpoint_000001", "first", 1, files=FILES)
    second = save(tmp_path / "checkpoint_000002", "second", 2)
    best = copy_checkpoint(first, tmp_path / "best")
    assert read_checkpoint(best) == read_checkpoint(first)
    assert (best / "policies.json").read_bytes() == FILES["policies.json"]
    assert (best / STATE_FILE).stat().st_ino == (first / STATE_FILE).stat().st_ino  # a hard link
    copy_checkpoint(second, best)
    assert read_checkpoint(best)[0] == {"value": "second"}
    assert sorted(p.name for p in best.iterdir()) == sorted([COMPLETE_FILE, METADATA_FILE, STATE_FILE])
    assert read_checkpoint(first)[0] == {"value": "first"}
    assert hidden(tmp_path) == []


def test_copy_falls_back_to_copying_and_sums_a_legacy_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_links(source: Any, dest: Any) -> None:
        raise OSError("cross-device link")

    monkeypatch.setattr(flowrl.storage.checkpoints.os, "link", no_links)
    legacy = write_legacy(tmp_path / "checkpoint_000007", "legacy")
    best = copy_checkpoint(legacy, tmp_path / "best")
    assert (best / STATE_FILE).stat().st_ino != (legacy / STATE_FILE).stat().st_ino
    assert read_checkpoint(best) == read_checkpoint(legacy)
    flip_a_byte(best / STATE_FILE)  # the copy has a marker: damage to it is detected
    with pytest.raises(CheckpointError, match="corrupt: state.pkl"):
        verify_checkpoint(best)


def test_copy_refuses_an_incomplete_source(tmp_path: Path) -> None:
    source = save(tmp_path / "checkpoint_000001", "x")
    (source / COMPLETE_FILE).unlink()
    with pytest.raises(CheckpointError, match="cannot copy checkpoint .*incomplete"):
        copy_checkpoint(source, tmp_path / "best")
    assert not (tmp_path / "best").exists() and hidden(tmp_path) == []


# --- writes killed at every step --------------------------------------------------------------------------

# Runs one operation in a fresh process that dies (os._exit, as SIGKILL would leave it) right after
# its LIMIT-th file-system step: every directory made, file opened for writing, fsync, rename, link,
# unlink and rmdir counts. It exits 0 if the operation finished in fewer steps.
KILLED_SCRIPT = textwrap.dedent(
    """
    import builtins, os, sys
    from pathlib import Path
    import flowrl.storage.checkpoints as ck

    operation, directory, limit = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    steps = 0

    def counted(real, counts=lambda *a, **k: True):
        def step(*args, **kwargs):
            global steps
            result = real(*args, **kwargs)
            if counts(*args, **kwargs):
                steps += 1
                if steps == limit:
                    os._exit(1)
            return result
        return step

    for name in ("mkdir", "fsync", "rename", "replace", "link", "unlink", "rmdir"):
        setattr(os, name, counted(getattr(os, name)))
    writes = lambda file, mode="r", *a, **k: any(c in mode for c in "wxa+")
    builtins.open = counted(builtins.open, writes)

    files = {"policies.safetensors": b"new weights" * 50, "policies.json": b"{}"}
    if operation == "overwrite":
        ck.write_checkpoint(directory / "checkpoint_000001", {"value": "new"}, {"iteration": 1}, files=files)
    elif operation == "new":
        ck.write_checkpoint(directory / "checkpoint_000002", {"value": "new"}, {"iteration": 2}, files=files)
    elif operation == "copy":
        ck.copy_checkpoint(directory / "checkpoint_000002", directory / "best")
    elif operation == "prune":
        ck.prune_checkpoints(directory, keep=1)
    os._exit(0)
    """
)


def prepare(directory: Path, operation: str) -> None:
    directory.mkdir()
    save(directory / "checkpoint_000001", "old", 1, files={"policies.json": b"{}"})
    if operation in ("copy", "prune"):
        save(directory / "checkpoint_000002", "new", 2, files=FILES)
    if operation == "copy":
        copy_checkpoint(directory / "checkpoint_000001", directory / "best")
    if operation == "prune":
        save(directory / "checkpoint_000003", "newest", 3)


def check_after_kill(directory: Path, operation: str) -> None:
    """Whatever instant the kill came at, a complete checkpoint is found and reads the old or the new state."""
    found = list_checkpoints(directory)
    latest = latest_checkpoint(directory)
    assert latest is not None and latest == found[-1]
    for path in found:
        read_checkpoint(path)  # never an error
    old = directory / "checkpoint_000001"
    if operation == "overwrite":
        assert found == [old]
        assert read_checkpoint(old)[0]["value"] in ("old", "new")
    elif operation == "new":
        assert found in ([old], [old, directory / "checkpoint_000002"])
        assert read_checkpoint(old)[0] == {"value": "old"}
        assert read_checkpoint(latest)[0]["value"] == ("old" if latest == old else "new")
    elif operation == "copy":
        assert read_checkpoint(directory / "best")[0]["value"] in ("old", "new")
    elif operation == "prune":
        assert latest == directory / "checkpoint_000003"
        assert found[0] in (old, directory / "checkpoint_000002", latest)


@pytest.mark.integration
@pytest.mark.timeout(240)
@pytest.mark.parametrize("operation", ["overwrite", "new", "copy", "prune"])
def test_a_kill_at_any_step_loses_nothing_and_the_next_write_cleans_up(tmp_path: Path, operation: str) -> None:
    killed_at = []
    saw_a_checkpoint_aside = False
    for limit in range(1, 200):
        directory = tmp_path / f"killed-after-{limit}"
        prepare(directory, operation)
        done = subprocess.run(
            [sys.executable, "-c", KILLED_SCRIPT, operation, str(directory), str(limit)],
            check=False,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode in (0, 1), done.stderr
        live = {p.name for p in directory.iterdir()}
        saw_a_checkpoint_aside |= any(".old-" in name and name[1:].split(".old-")[0] not in live for name in live)
        check_after_kill(directory, operation)
        save(directory / "checkpoint_000009", "next", 9)  # the next write cleans up what the kill left
        assert hidden(directory) == [], f"killed after step {limit}"
        if done.returncode == 0:
            break
        killed_at.append(limit)
    else:
        pytest.fail(f"{operation} never finished within {limit} steps")
    # The operation ran to completion last: its result is in place.
    if operation == "overwrite":
        assert read_checkpoint(directory / "checkpoint_000001")[0] == {"value": "new"}
    elif operation == "new":
        assert read_checkpoint(directory / "checkpoint_000002")[0] == {"value": "new"}
    elif operation == "copy":
        assert read_checkpoint(directory / "best")[0] == {"value": "new"}
    elif operation == "prune":
        assert list_checkpoints(directory) == [directory / "checkpoint_000003", directory / "checkpoint_000009"]
    assert len(killed_at) >= 5  # the instrumentation did interrupt the operation
    if operation in ("overwrite", "copy"):
        assert saw_a_checkpoint_aside  # a kill between the swap's two renames was among them
