"""Restart budgets: how often a run may recreate one kind of actor, counted over a sliding window of time.

Rollout workers, replay shards and aggregators each have a :class:`RestartBudget` of their own,
with the same cap (``max_worker_restarts``) and window (``restart_window_s``): a kind that fails
in a loop stops the run with a :class:`~flowrl.errors.WorkerFailureError`, while a run of weeks
that loses an actor now and then never runs out. Restart times are wall-clock times, so a
checkpoint carries them into the resumed run's process and the window goes on there.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence

from flowrl.deferred import ray
from flowrl.errors import ShardFailedError, WorkerFailureError

MAX_RESTART_DELAY_S = 30.0


def restart_delay_s(failed_starts: int) -> float:
    """Seconds to wait before recreating an actor whose last ``failed_starts`` incarnations failed to start.

    0 after an actor that ran (a one-off crash is replaced at once), then 1, 2, 4 ...
    capped at 30: an actor whose constructor keeps failing backs off.
    """
    return 0.0 if failed_starts == 0 else min(2.0 ** (failed_starts - 1), MAX_RESTART_DELAY_S)


def failed_to_start(error: BaseException) -> bool:
    """Whether ``error`` (as a call or a gather reported it) says the actor's constructor failed."""
    if isinstance(error, ShardFailedError) and error.__cause__ is not None:
        error = error.__cause__
    return isinstance(error, ray.exceptions.RayActorError) and bool(error.actor_init_failed)


class RestartBudget:
    """At most ``max_restarts`` restarts of one ``kind`` of actor within any ``window_s`` seconds.

    :meth:`spend` grants a restart (recording its time) or, with ``max_restarts`` granted in
    the last ``window_s`` seconds, raises; :attr:`exhausted` then says so until a later
    restart is granted. :meth:`backoff` is the delay before recreating an actor slot whose
    replacements keep failing to start. ``max_restarts=None``: no cap. ``clock`` gives
    wall-clock seconds (``time.time``; tests pass their own).
    """

    def __init__(
        self, kind: str, max_restarts: int | None, window_s: float, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.kind = kind
        self.max_restarts = max_restarts
        self.window_s = window_s
        self.exhausted = False
        self._clock = clock
        self._times: collections.deque[float] = collections.deque()
        self._failed_starts: dict[int, int] = collections.defaultdict(int)  # in a row, per actor slot

    def recent(self) -> int:
        """Restarts granted within the last ``window_s`` seconds."""
        cutoff = self._clock() - self.window_s
        while self._times and self._times[0] <= cutoff:
            self._times.popleft()
        return len(self._times)

    def spend(self, what: str, cause: BaseException, *, worker_indices: Sequence[int] = ()) -> None:
        """Grant one restart, or raise :class:`~flowrl.errors.WorkerFailureError` (``what`` failed, with
        ``cause`` chained and its text in the message) when the window holds ``max_restarts`` already."""
        recent = self.recent()
        if self.max_restarts is not None and recent >= self.max_restarts:
            self.exhausted = True
            raise WorkerFailureError(
                f"{what}, and the run already restarted {self.kind}s {recent} times in the last "
                f"{self.window_s:g} s (max_worker_restarts={self.max_restarts}, restart_window_s={self.window_s:g}; "
                f"a resumed run may raise them). Last failure:\n{cause}",
                worker_indices=list(worker_indices),
            ) from cause
        self.exhausted = False
        self._times.append(self._clock())

    def backoff(self, slot: int, cause: BaseException) -> float:
        """The delay before recreating the actor in ``slot``: it grows while its replacements fail to start."""
        self._failed_starts[slot] = self._failed_starts[slot] + 1 if failed_to_start(cause) else 0
        return restart_delay_s(self._failed_starts[slot])

    def get_state(self) -> list[float]:
        """The restart times within the window, for checkpoints."""
        self.recent()
        return list(self._times)

    def set_state(self, times: Sequence[float]) -> None:
        """Restore :meth:`get_state`'s output: those restarts count against this budget until they age out."""
        self._times = collections.deque(sorted(float(t) for t in times))
        self.recent()
