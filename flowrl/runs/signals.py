"""The signals that end a run's training as Ctrl-C does: SIGTERM and SIGHUP raise :class:`SignalInterrupt`.

:meth:`~flowrl.runs.run.Run.train` installs the handlers with :func:`interrupting_signals`, then names
the signal that ended training with :func:`interrupt_signal`.
"""

from __future__ import annotations

import contextlib
import signal
import threading
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


def interrupt_signal(interrupt: KeyboardInterrupt) -> signal.Signals:
    """The signal behind ``interrupt``: SIGTERM or SIGHUP received by :func:`interrupting_signals`'
    handlers, else SIGINT."""
    if isinstance(interrupt, SignalInterrupt):
        return interrupt.signal
    return _received[-1] if _received else signal.SIGINT


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    _received.append(signal.Signals(signum))
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
