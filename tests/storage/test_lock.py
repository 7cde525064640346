"""flowrl.storage.lock: one driver per run directory (taken, refused naming the owner, stale, released)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from flowrl.errors import RunError, RunWarning
from flowrl.storage.lock import LOCK_FILE, RunLock, RunLockedError, read_lock, stale_reason

pytestmark = pytest.mark.unit


def write_lock(directory: Path, *, host: str, pid: int, heartbeat_age_s: float = 0.0, token: str = "old") -> None:
    """A lock file as another driver leaves it, with its heartbeat ``heartbeat_age_s`` seconds old."""
    path = directory / LOCK_FILE
    path.write_text(json.dumps({"host": host, "pid": pid, "started": 1_700_000_000.0, "token": token}))
    beat = time.time() - heartbeat_age_s
    os.utime(path, (beat, beat))


def dead_pid() -> int:
    """A pid no process has on this host."""
    for pid in range(4_000_000, 1, -997):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            continue
    raise AssertionError("no free pid found")


def test_the_lock_is_taken_and_names_this_driver(tmp_path: Path) -> None:
    with RunLock.acquire(tmp_path) as lock:
        owner = read_lock(tmp_path)
        assert owner is not None and owner == lock.owner
        assert (owner.host, owner.pid) == (socket.gethostname(), os.getpid())
        assert lock.taken_over is None and not lock.lost
        assert stale_reason(owner) is None
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_second_driver_is_refused_naming_the_owner(tmp_path: Path) -> None:
    with RunLock.acquire(tmp_path) as lock:
        with pytest.raises(RunLockedError, match=rf"in use by another driver \(pid {os.getpid()} on host ") as refused:
            RunLock.acquire(tmp_path)
        assert refused.value.owner == read_lock(tmp_path)
        assert isinstance(refused.value, RunError)  # the CLI's exit status 2
        assert "last heartbeat 0 s ago" in str(refused.value)
        assert read_lock(tmp_path) == lock.owner  # the refusal changed nothing


def test_a_live_driver_on_another_host_with_a_fresh_heartbeat_holds_the_lock(tmp_path: Path) -> None:
    write_lock(tmp_path, host="node-7", pid=dead_pid(), heartbeat_age_s=10)
    with pytest.raises(RunLockedError, match=r"pid \d+ on host node-7 since .*last heartbeat 10 s ago"):
        RunLock.acquire(tmp_path)


def test_a_lock_whose_pid_is_dead_on_this_host_is_taken_over_with_a_warning(tmp_path: Path) -> None:
    pid = dead_pid()
    write_lock(tmp_path, host=socket.gethostname(), pid=pid)
    with pytest.warns(RunWarning, match=rf"taking over the lock .*pid {pid} on host .*: pid {pid} is not running"):
        lock = RunLock.acquire(tmp_path)
    with lock:
        assert lock.taken_over is not None and lock.taken_over.pid == pid
        assert read_lock(tmp_path) == lock.owner
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no file moved aside is left


def test_a_lock_whose_heartbeat_is_too_old_is_taken_over(tmp_path: Path) -> None:
    write_lock(tmp_path, host="node-7", pid=os.getpid(), heartbeat_age_s=301)  # a pid alive here means nothing there
    with pytest.warns(RunWarning, match=r"pid \d+ on host node-7 .*heartbeat is 301 s old \(more than 300 s\)"):
        lock = RunLock.acquire(tmp_path)
    with lock:
        assert lock.taken_over is not None and lock.taken_over.host == "node-7"
    write_lock(tmp_path, host="node-7", pid=os.getpid(), heartbeat_age_s=20)
    with pytest.warns(RunWarning, match="heartbeat is 20 s old"):
        RunLock.acquire(tmp_path, stale_after_s=15).release()  # the bound is a parameter


def test_a_lock_that_never_got_its_owner_is_refused_while_new_and_removed_once_stale(tmp_path: Path) -> None:
    (tmp_path / LOCK_FILE).write_text("")
    with pytest.raises(RunLockedError, match="does not name its owner yet"):
        RunLock.acquire(tmp_path)
    old = time.time() - 400
    os.utime(tmp_path / LOCK_FILE, (old, old))
    RunLock.acquire(tmp_path).release()
    assert list(tmp_path.iterdir()) == []


def test_the_lock_is_released_on_an_error(tmp_path: Path) -> None:
    with pytest.raises(ZeroDivisionError), RunLock.acquire(tmp_path):
        _ = 1 / 0
    assert not (tmp_path / LOCK_FILE).exists()
    RunLock.acquire(tmp_path).release()


def test_release_leaves_the_lock_of_a_driver_that_took_it_over(tmp_path: Path) -> None:
    lock = RunLock.acquire(tmp_path)
    write_lock(tmp_path, host="node-7", pid=1, token="theirs")  # another driver took it over meanwhile
    lock.release()
    lock.release()  # a second release does nothing
    owner = read_lock(tmp_path)
    assert owner is not None and owner.token == "theirs"


def test_the_heartbeat_refreshes_the_lock_and_notices_a_takeover(tmp_path: Path) -> None:
    lock = RunLock.acquire(tmp_path, heartbeat_interval_s=0.05)
    try:
        old = time.time() - 100
        os.utime(tmp_path / LOCK_FILE, (old, old))
        deadline = time.monotonic() + 10
        while (tmp_path / LOCK_FILE).stat().st_mtime < old + 50 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert time.time() - (tmp_path / LOCK_FILE).stat().st_mtime < 50  # refreshed
        assert not lock.lost
        write_lock(tmp_path, host="node-7", pid=1, token="theirs")
        while not lock.lost and time.monotonic() < deadline:
            time.sleep(0.02)
        assert lock.lost
    finally:
        lock.release()
    owner = read_lock(tmp_path)
    assert owner is not None and owner.token == "theirs"
