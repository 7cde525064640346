"""One driver per run directory: the ``run.lock`` file a driver holds while it writes the run.

A driver takes the lock when it starts or resumes a run and releases it when the run closes::

    with RunLock.acquire(run_dir):  # RunLockedError names the driver that holds it
        ...  # write the run directory

The lock is a file created with ``O_CREAT | O_EXCL``, which is atomic on local filesystems and
on NFS (v3 and later), holding its owner: host, pid, start time and a token of its own. Its
modification time is the owner's heartbeat, refreshed every :data:`HEARTBEAT_INTERVAL_S` seconds by
a daemon thread, so that a lock left by a driver that can no longer release it is told from one
held: a lock is *stale* when its pid is dead on this same host, or when its heartbeat is older
than :data:`STALE_AFTER_S` (5 minutes; this is how a driver on another node that died is found).
A stale lock is taken over with a :class:`~flowrl.errors.RunWarning` naming the old owner. The
heartbeat thread also notices when another driver took the lock over (this driver was frozen for
longer than the bound): :attr:`RunLock.lost` is then set and the run stops writing.

Readers of a run directory (``flowrl plot``, ``flowrl plan``, ``flowrl doctor``, ``load_policy``)
never take the lock.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowrl.errors import RunError, RunWarning

LOCK_FILE = "run.lock"
HEARTBEAT_INTERVAL_S = 30.0
STALE_AFTER_S = 300.0
# A lock file just created by another driver may not hold its owner yet: how long to wait for it.
_UNWRITTEN_WAIT_S = 2.0
_ATTEMPTS = 5  # takeovers raced by other drivers before giving up
_JOIN_TIMEOUT_S = 5.0  # the longest release() waits for the heartbeat thread


@dataclass(frozen=True)
class LockOwner:
    """The driver a ``run.lock`` names: ``host``, ``pid``, ``started`` (epoch seconds), its ``token``, and its
    last ``heartbeat`` (the file's modification time, epoch seconds)."""

    host: str
    pid: int
    started: float
    token: str
    heartbeat: float

    def describe(self, now: float | None = None) -> str:
        """``pid 4242 on host node-1 since 2025-01-01 12:00:00, last heartbeat 12 s ago``."""
        now = time.time() if now is None else now
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        age = max(0.0, now - self.heartbeat)
        return f"pid {self.pid} on host {self.host} since {since}, last heartbeat {age:.0f} s ago"


class RunLockedError(RunError):
    """Another driver holds the run directory's lock; ``owner`` is that driver (a :class:`LockOwner`)."""

    def __init__(self, message: str, owner: LockOwner | None = None) -> None:
        super().__init__(message)
        self.owner = owner


def read_lock(directory: str | os.PathLike[str]) -> LockOwner | None:
    """The owner ``directory``'s ``run.lock`` names, or None when there is no lock or it does not hold an owner
    (yet: a driver writes it just after creating it)."""
    path = Path(directory) / LOCK_FILE
    try:
        heartbeat = path.stat().st_mtime
        data = json.loads(path.read_text(encoding="utf-8"))
        return LockOwner(str(data["host"]), int(data["pid"]), float(data["started"]), str(data["token"]), heartbeat)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def stale_reason(owner: LockOwner, *, stale_after_s: float = STALE_AFTER_S, now: float | None = None) -> str | None:
    """Why ``owner``'s lock is stale (its pid is dead on this host, or its heartbeat is older than
    ``stale_after_s``), or None while it is held."""
    now = time.time() if now is None else now
    if owner.host == socket.gethostname() and not _pid_alive(owner.pid):
        return f"pid {owner.pid} is not running on this host"
    if now - owner.heartbeat > stale_after_s:
        return f"its heartbeat is {now - owner.heartbeat:.0f} s old (more than {stale_after_s:g} s)"
    return None


class RunLock:
    """The lock of a run directory, held by this process: made by :meth:`acquire`, given up by :meth:`release`.

    ``owner`` is this driver; ``taken_over`` the stale owner it replaced (None if the lock was free);
    ``lost`` says another driver took the lock over since (then this one must stop writing).
    """

    def __init__(
        self, directory: Path, owner: LockOwner, taken_over: LockOwner | None, heartbeat_interval_s: float
    ) -> None:
        self.directory = directory
        self.owner = owner
        self.taken_over = taken_over
        self.lost = False
        self._released = False
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._beat, args=(heartbeat_interval_s,), name=f"flowrl-run-lock-{directory.name}", daemon=True
        )
        self._thread.start()

    @property
    def path(self) -> Path:
        """The lock file."""
        return self.directory / LOCK_FILE

    @classmethod
    def acquire(
        cls,
        directory: str | os.PathLike[str],
        *,
        stale_after_s: float = STALE_AFTER_S,
        heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S,
    ) -> RunLock:
        """Take ``directory``'s lock; :class:`RunLockedError` naming the owner when another driver holds it.

        A stale lock (see :func:`stale_reason`) is taken over with a :class:`~flowrl.errors.RunWarning`.
        """
        directory = Path(directory)
        taken_over: LockOwner | None = None
        for _ in range(_ATTEMPTS):
            owner = _create(directory)
            if owner is not None:
                return cls(directory, owner, taken_over, heartbeat_interval_s)
            held = _wait_for_owner(directory, stale_after_s)
            if held is None:
                continue  # released meanwhile, or an unwritten lock abandoned long ago (removed): try again
            reason = stale_reason(held, stale_after_s=stale_after_s)
            if reason is None:
                raise RunLockedError(
                    f"run directory {str(directory)!r} is in use by another driver ({held.describe()}); "
                    f"one driver at a time writes a run (the lock is {str(directory / LOCK_FILE)!r}; it is taken "
                    f"over once that pid is dead on its host or its heartbeat is {stale_after_s:g} s old)",
                    held,
                )
            if _remove_if_owned(directory, held):
                taken_over = held
                warnings.warn(
                    f"run directory {str(directory)!r}: taking over the lock of a driver that is gone "
                    f"({held.describe()}): {reason}",
                    RunWarning,
                    stacklevel=2,
                )
        raise RunError(
            f"run directory {str(directory)!r}: could not take its lock in {_ATTEMPTS} tries; other drivers keep "
            f"taking it (see {str(directory / LOCK_FILE)!r})"
        )

    def _beat(self, interval: float) -> None:
        gone = failed = 0  # beats in a row without the lock file, and with a heartbeat that could not be written
        while not self._stop.wait(interval):
            current = read_lock(self.directory)
            if current is not None and current.token != self.owner.token:
                self.lost = True  # another driver took it over
                return
            gone = gone + 1 if current is None and not self.path.exists() else 0
            if gone >= 2:  # removed (one missing look may be a filesystem hiccup)
                self.lost = True
                return
            try:
                os.utime(self.path)
                failed = 0
            except OSError as error:  # a filesystem hiccup: the next beat tries again
                failed += 1
                if failed == 2:
                    warnings.warn(
                        f"the heartbeat of {str(self.path)!r} cannot be written ({error}): if it stays so, another "
                        f"driver may take the run over once the heartbeat is {STALE_AFTER_S:g} s old",
                        RunWarning,
                        stacklevel=1,
                    )

    def release(self) -> None:
        """Stop the heartbeat and remove the lock file, if it is still this driver's (calling it again does nothing)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=_JOIN_TIMEOUT_S)  # a daemon: one stuck on a hung filesystem is left behind
        if not self.lost and not self._released:
            _remove_if_owned(self.directory, self.owner)
        self._released = True

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"RunLock({str(self.path)!r}, pid={self.owner.pid}, host={self.owner.host!r})"


def _create(directory: Path) -> LockOwner | None:
    """Create the lock file naming this process (None when it exists already)."""
    path = directory / LOCK_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return None
    started = time.time()
    data: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid(), "started": started}
    data["token"] = uuid.uuid4().hex
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(data) + "\n")
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return LockOwner(data["host"], data["pid"], started, data["token"], path.stat().st_mtime)


def _wait_for_owner(directory: Path, stale_after_s: float) -> LockOwner | None:
    """The owner of the existing lock; None if it is gone, or if it never got an owner (then it is removed)."""
    path = directory / LOCK_FILE
    deadline = time.monotonic() + _UNWRITTEN_WAIT_S
    while True:
        owner = read_lock(directory)
        if owner is not None:
            return owner
        try:
            age = time.time() - path.stat().st_mtime
        except FileNotFoundError:
            return None
        if age > stale_after_s:
            # A driver died between creating the lock and writing its owner: nobody holds it.
            unwritten = path.with_name(f".{LOCK_FILE}.{uuid.uuid4().hex}")
            with contextlib.suppress(FileNotFoundError):
                os.rename(path, unwritten)
                unwritten.unlink()
            return None
        if time.monotonic() > deadline:
            raise RunLockedError(
                f"run directory {str(directory)!r} is in use by another driver (its lock "
                f"{str(path)!r} was created {age:.0f} s ago and does not name its owner yet)"
            )
        time.sleep(0.05)


def _remove_if_owned(directory: Path, owner: LockOwner) -> bool:
    """Remove the lock file if it still names ``owner``; whether it was removed.

    The file is first moved aside atomically (only one of several drivers moving it succeeds), then checked: a lock
    that another driver took meanwhile is put back where it was.
    """
    path = directory / LOCK_FILE
    aside = path.with_name(f".{LOCK_FILE}.{uuid.uuid4().hex}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return False
    if _token_of(aside) != owner.token:
        with contextlib.suppress(FileExistsError):
            os.link(aside, path)  # another driver's fresh lock: put it back (unless a third one took the place)
        aside.unlink()
        return False
    aside.unlink()
    return True


def _token_of(path: Path) -> str | None:
    """The token of the lock file at ``path`` (None if unreadable)."""
    try:
        return str(json.loads(path.read_text(encoding="utf-8"))["token"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
