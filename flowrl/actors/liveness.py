"""Liveness of remote rollout workers: progress, not deadlines.

A worker counts its env steps in a :class:`ProgressCounter` and answers ``progress`` (a
:class:`Progress`) through its control thread, even mid-sample. The driver judges a worker
whose requested sample is overdue with a :class:`LivenessMonitor`, by these rules:

- it answers and took an env step (or began a sample) within the last ``sample_timeout_s``:
  alive, however slow its fragments are; it is checked again once that long may have passed
  with no step;
- it answers with no env step for ``sample_timeout_s`` and a steady heartbeat: hung (an env stuck
  in a sleep, a lock, a socket);
- it answers, with no env step for ``sample_timeout_s``, but its heartbeat thread missed beats
  since the last answer (the GIL was held, by a long env step in a C extension): busy, so alive;
- it does not answer: on the driver's node, a process in state ``T`` (stopped, e.g. ``SIGSTOP``)
  is hung once ``STOPPED_GRACE_S`` passed without an answer; otherwise (the GIL held, or a process
  on another node, whose state cannot be read) it is hung after ``worker_unresponsive_timeout_s``
  without an answer.

:class:`SlowWorkers` reports stragglers: a worker whose seconds per fragment exceed
``slow_worker_factor`` times its siblings' median.
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from flowrl.errors import RunWarning

logger = logging.getLogger(__name__)

#: Seconds between two looks at a probe that has not been answered yet.
ANSWER_WAIT_S = 1.0
#: Seconds an unanswered probe waits before a stopped process counts as hung.
STOPPED_GRACE_S = 2.0
#: Seconds between two beats of a worker's heartbeat thread.
HEARTBEAT_S = 0.25
#: A heartbeat late by this much means the GIL was held (an env step in a C extension): busy, not idle.
HELD_GIL_S = 1.0


class Progress(NamedTuple):
    """What a worker's ``progress`` control call answers: env steps taken so far, seconds since the last
    one (or since its current sample began, if later), and the longest its heartbeat thread was held up
    since the last answer (the GIL held by another thread; 0 without a heartbeat)."""

    env_steps: int
    idle_s: float
    held_s: float = 0.0


class ProgressCounter:
    """A worker's progress: bumped by each env step and at the start and end of each sample, read by its
    control thread (plain attribute writes, safe under the GIL)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.env_steps = 0
        self._last = clock()
        self._sample_started: float | None = None
        self._fragment_s: list[float] = []
        self._beat: float | None = None
        self._held_s = 0.0

    def start_heartbeat(self) -> None:
        """Beat every ``HEARTBEAT_S`` in a daemon thread: a beat held up shows the GIL was held (see :meth:`read`)."""
        self._beat = self._clock()
        threading.Thread(target=self._beat_forever, name="flowrl-heartbeat", daemon=True).start()

    def _beat_forever(self) -> None:
        while True:
            time.sleep(HEARTBEAT_S)
            self.beat()

    def beat(self) -> None:
        """One heartbeat: how late it is joins the longest delay since the last :meth:`read`."""
        now = self._clock()
        if self._beat is not None:
            self._held_s = max(self._held_s, now - self._beat - HEARTBEAT_S)
        self._beat = now

    def step(self) -> None:
        """Count one env step."""
        self.env_steps += 1
        self._last = self._clock()

    def sample_started(self) -> None:
        """A sample began: the worker is busy from now on."""
        self._sample_started = self._last = self._clock()

    def sample_ended(self) -> None:
        """A sample ended: record its seconds for :meth:`pop_fragment_s`."""
        now = self._clock()
        if self._sample_started is not None:
            self._fragment_s.append(now - self._sample_started)
        self._sample_started = None
        self._last = now

    def read(self) -> Progress:
        """The progress now, with the longest heartbeat delay since the last read (the beat due now included)."""
        now = self._clock()
        held = self._held_s if self._beat is None else max(self._held_s, now - self._beat - HEARTBEAT_S)
        self._held_s = 0.0
        return Progress(self.env_steps, max(0.0, now - self._last), max(0.0, held))

    def pop_fragment_s(self) -> float | None:
        """Mean seconds per sample since the last call; with none finished, how long the one in progress has
        run (a lower bound on its seconds); None if the worker has not sampled since."""
        done, self._fragment_s = self._fragment_s, []
        if done:
            return sum(done) / len(done)
        started = self._sample_started
        return None if started is None else self._clock() - started


def process_state(pid: int) -> str | None:
    """The state letter of process ``pid`` on this machine (``R``, ``S``, ``T`` for stopped ...), None if unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            # "pid (comm) state ...": comm may hold spaces and parentheses, the state follows the last ")".
            return stat.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None


@dataclass
class _Probe:
    ref: Any
    sent: float


#: What a probe's answer is: the progress, None while unanswered, or the error of a dead worker.
Answer = Progress | None | BaseException


class LivenessMonitor:
    """Judges workers whose requests are overdue, without blocking (see the module docs for the rules).

    ``ask(worker)`` sends a progress probe and returns its handle; ``answer(handle)`` gives its
    :data:`Answer` without waiting; ``stopped(worker)`` says whether the worker's process is known
    to be stopped. :meth:`check` returns the seconds until a worker may next be checked, or None
    when it is hung, :attr:`reason` then saying why.
    """

    def __init__(
        self,
        no_progress_s: float,
        unresponsive_s: float,
        *,
        ask: Callable[[Any], Any],
        answer: Callable[[Any], Answer],
        stopped: Callable[[Any], bool],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.no_progress_s = no_progress_s
        self.unresponsive_s = unresponsive_s
        self._ask, self._answer, self._stopped, self._clock = ask, answer, stopped, clock
        self._probes: dict[Any, _Probe] = {}
        self.reason = ""

    def check(self, worker: Any, since: float | None = None) -> float | None:
        """Seconds until ``worker`` may next be checked, or None if it is hung (:attr:`reason` says why).

        ``since``: when the request being judged began; a probe sent before it (about an earlier request,
        since answered) is dropped and a new one sent.
        """
        now = self._clock()
        probe = self._probes.get(worker)
        if probe is not None and since is not None and probe.sent < since:
            probe = None
        if probe is None:
            self._probes[worker] = _Probe(self._ask(worker), now)
            return ANSWER_WAIT_S
        answer = self._answer(probe.ref)
        if answer is None:
            silent = now - probe.sent
            if silent >= STOPPED_GRACE_S and self._stopped(worker):
                return self._hung(worker, "its process is stopped (state T)")
            if silent >= self.unresponsive_s:
                return self._hung(
                    worker,
                    f"its control thread did not answer for {silent:.0f} s "
                    f"(worker_unresponsive_timeout_s={self.unresponsive_s:g})",
                )
            return min(ANSWER_WAIT_S, self.unresponsive_s - silent)
        del self._probes[worker]
        if isinstance(answer, BaseException):
            return self._hung(worker, f"it died ({type(answer).__name__})")
        if answer.held_s >= HELD_GIL_S:  # its GIL was held: a long env step, busy rather than idle
            return self.no_progress_s
        if answer.idle_s >= self.no_progress_s:
            return self._hung(
                worker, f"it took no env step for {answer.idle_s:.1f} s (sample_timeout_s={self.no_progress_s:g})"
            )
        return self.no_progress_s - answer.idle_s

    def _hung(self, worker: Any, reason: str) -> float | None:
        """Record why ``worker`` is hung; None (the verdict :meth:`check` returns)."""
        self._probes.pop(worker, None)
        self.reason = reason
        return None

    def forget(self, worker: Any) -> None:
        """Drop what is known of ``worker`` (it was replaced)."""
        self._probes.pop(worker, None)


#: A worker whose fragments take less than this is never a straggler, whatever its siblings' take: at a few
#: milliseconds per fragment the ratio between workers is noise (a busy machine), not a slow worker.
MIN_SLOW_FRAGMENT_S = 0.25


#: How many times slower than when it was last warned about a slow worker must get to be warned about again.
WARN_AGAIN_FACTOR = 2.0


class SlowWorkers:
    """Stragglers among the workers: seconds per fragment above ``factor`` times the median of the others'
    (and above :data:`MIN_SLOW_FRAGMENT_S`).

    :meth:`update` takes each reporting worker's seconds per fragment and returns how many are slow
    now; each is warned about (a :class:`~flowrl.errors.RunWarning` and a log line with the measured
    seconds) when it becomes slow, and again only if it gets :data:`WARN_AGAIN_FACTOR` times slower than
    when last warned, or after it has caught up and fallen behind once more.
    """

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.slow: set[int] = set()
        self._warned_s: dict[int, float] = {}  # slow worker -> its seconds per fragment when last warned
        self._lock = threading.Lock()

    def update(self, fragment_s: Mapping[int, float | None]) -> int:
        """Judge the workers that reported (index to seconds per fragment; None: did not sample); how many are slow."""
        measured = {index: s for index, s in fragment_s.items() if s is not None}
        with self._lock:
            slow = set()
            for index, seconds in measured.items():
                others = [s for i, s in measured.items() if i != index]
                if not others:
                    continue
                median = statistics.median(others)
                if seconds > self.factor * median and seconds > MIN_SLOW_FRAGMENT_S:
                    slow.add(index)
                    if seconds >= WARN_AGAIN_FACTOR * self._warned_s.get(index, math.inf) or index not in self.slow:
                        self._warned_s[index] = seconds
                        message = (
                            f"rollout worker {index} is slow: {seconds:.2f} s per fragment, over "
                            f"slow_worker_factor={self.factor:g} x its siblings' median of {median:.2f} s"
                        )
                        logger.warning(message)
                        warnings.warn(message, RunWarning, stacklevel=2)
            # A worker that did not report keeps its standing until it does.
            self.slow = slow | {index for index in self.slow if index not in measured and index in fragment_s}
            self._warned_s = {index: s for index, s in self._warned_s.items() if index in self.slow}
            return len(self.slow)
