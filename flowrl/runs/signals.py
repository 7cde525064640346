"""The signals that end a run's training as Ctrl-C does: SIGTERM and SIGHUP raise :class:`SignalInterrupt`.

:meth:`~flowrl.runs.run.Run.train` installs the handlers with :func:`interrupting_signals`, then names
the signal that ended training with :func:`interrupt_signal` and when it came with :func:`signal_received_at`.
:func:`deadline` bounds the save that follows (a preemption's SIGKILL comes a fixed time after SIGTERM).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

# The signals Run.train turns into a checkpoint and a summary, as Python already does with SIGINT (Ctrl-C).
HANDLED_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)
)


class SignalInterrupt(KeyboardInterrupt):
    """Raised in the main thread by the handlers :meth:`~flowrl.runs.run.Run.train` installs for
    :data:`HANDLED_SIGNALS`.

    A ``KeyboardInterrupt``, so that everything treats SIGTERM and SIGHUP as it treats Ctrl-C
    (``except Exception`` lets it through); ``signal`` is the signal received.
    """

    def __init__(self, signum: int) -> None:
        self.signal = signal.Signals(signum)
        super().__init__(f"received {self.signal.name}")


# The signals the handlers of interrupting_signals() received in the current block. A signal that
# lands in a blocking Ray call (ray.get, ray.wait) may surface as a plain KeyboardInterrupt rather
# than the handler's SignalInterrupt, so the exception alone cannot always say which signal it was.
_received: list[signal.Signals] = []
# When (time.monotonic()) the first of them came.
_received_at: list[float] = []


def interrupt_signal(interrupt: KeyboardInterrupt) -> signal.Signals:
    """The signal behind ``interrupt``: SIGTERM or SIGHUP received by :func:`interrupting_signals`'
    handlers, else SIGINT."""
    if isinstance(interrupt, SignalInterrupt):
        return interrupt.signal
    return _received[-1] if _received else signal.SIGINT


def signal_received_at() -> float | None:
    """When (:func:`time.monotonic`) :func:`interrupting_signals`' handlers got their first signal in the
    current block; None if they got none (Ctrl-C goes to Python's own handler)."""
    return _received_at[0] if _received_at else None


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    _received.append(signal.Signals(signum))
    _received_at.append(time.monotonic())
    raise SignalInterrupt(signum)


@contextlib.contextmanager
def interrupting_signals() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise :class:`SignalInterrupt` in the main thread.

    The previous handlers come back when the block ends. Nothing changes outside the main
    thread (Python runs signal handlers only there), nor for a signal that is ignored
    (``nohup`` ignores SIGHUP so that a command outlives its terminal: so does the run).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received.clear()
    _received_at.clear()
    previous: dict[signal.Signals, Any] = {}
    try:
        for signum in HANDLED_SIGNALS:
            handler = signal.getsignal(signum)
            if handler is signal.SIG_IGN:
                continue
            # None: a handler set outside Python, which cannot be put back; the default action is the closest.
            previous[signum] = signal.SIG_DFL if handler is None else handler
            signal.signal(signum, _raise_interrupt)
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class DeadlinePassed(KeyboardInterrupt):
    """Raised in the main thread by :func:`deadline` when its time has come.

    A ``KeyboardInterrupt``, so that it cuts short what a second signal would (and is let
    through by ``except Exception``); a blocking Ray call may turn it into a plain
    ``KeyboardInterrupt``: :attr:`Deadline.passed` tells them apart.
    """


class Deadline:
    """What :func:`deadline` yields: ``passed`` becomes True when the deadline fired."""

    def __init__(self) -> None:
        self.passed = False


@contextlib.contextmanager
def deadline(at: float | None) -> Iterator[Deadline]:
    """Within the block, :class:`DeadlinePassed` is raised in the main thread once :func:`time.monotonic`
    reaches ``at`` (a ``SIGALRM`` timer; the previous handler and timer come back when the block ends, the
    timer less the time the block took).

    With ``at`` None, outside the main thread or without ``SIGALRM`` (Windows) nothing is timed:
    the caller checks the time itself between steps. A deadline already passed fires at once.
    """
    state = Deadline()
    if at is None or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield state
        return

    def fire(signum: int, frame: FrameType | None) -> None:
        state.passed = True
        raise DeadlinePassed(f"the deadline passed ({signal.Signals(signum).name})")

    previous = signal.signal(signal.SIGALRM, fire)
    started = time.monotonic()
    # Another timer (pytest-timeout's, a caller's) is put back when the block ends, less the time it took.
    previous_delay, previous_interval = signal.setitimer(signal.ITIMER_REAL, max(at - started, 1e-6))
    try:
        yield state
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)
        if previous_delay > 0:
            left = max(previous_delay - (time.monotonic() - started), 1e-6)
            signal.setitimer(signal.ITIMER_REAL, left, previous_interval)
