"""Metrics shared by every operator of one dataflow: counters, timers and free-form info.

One :class:`MetricsContext` belongs to a whole plan. Iterators hold it through a
:class:`SharedMetrics` holder, so that a union can point all of its children at one
context after they were built separately. While an iterator computes its next item the
context is installed for the current thread, which is how operators reach it through
:meth:`flowrl.iterators.LocalIterator.get_metrics`. Stages measure their own time in a per-thread
stack of frames, and :func:`account` attributes parts of it (waiting, transferring, blocked, held).
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from flowrl.errors import IteratorUsageError


class TimerStat:
    """Accumulates the durations of a repeated section and the units it processed.

    Use as a context manager (``with metrics.timers["learn"]: ...``); call
    :meth:`push_units_processed` inside to get a throughput.
    """

    def __init__(self) -> None:
        self.count = 0
        self.total_s = 0.0
        self.last_s = 0.0
        self.units = 0
        self._start: float | None = None

    def __enter__(self) -> "TimerStat":
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._start is not None, "TimerStat exited without being entered"
        self.push(time.perf_counter() - self._start)
        self._start = None

    def push(self, seconds: float) -> None:
        """Record one timed section lasting ``seconds``."""
        self.count += 1
        self.total_s += seconds
        self.last_s = seconds

    def push_units_processed(self, units: int) -> None:
        """Record ``units`` items (steps, samples) processed by the timed section."""
        self.units += units

    @property
    def mean(self) -> float:
        """Mean seconds per section (0 before the first one)."""
        return self.total_s / self.count if self.count else 0.0

    @property
    def mean_throughput(self) -> float:
        """Units processed per second of timed sections (0 before any time was timed)."""
        return self.units / self.total_s if self.total_s > 0 else 0.0

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_start"] = None
        return state

    def __repr__(self) -> str:
        return f"TimerStat(count={self.count}, mean={self.mean:.6f}s)"


@dataclass
class StageStats:
    """What one stage of a dataflow did: items it yielded and seconds spent in its own code.

    ``time_s`` excludes the time spent pulling from the stages it reads, so the times of
    all stages add up to the time the dataflow ran (waits on actors count for the stage
    that waited). Of ``time_s``, ``wait_s`` went to waiting for input (on actors, threads,
    queues or sibling iterators), ``transfer_s`` to fetching results that had arrived
    (Ray's deserialization) and ``blocked_s`` to waiting, blocked on output, until what
    consumes it had room (replay shards at their limit of calls in flight); the rest is the
    stage's own work. ``held_s`` is not part of ``time_s``: the seconds it held an item back
    while the dataflow ran other branches (a full queue, a sibling iterator behind it).
    ``bytes`` sums the sizes of the items that report one (``size_bytes()``, as sample batches do).
    """

    items: int = 0
    time_s: float = 0.0
    wait_s: float = 0.0
    transfer_s: float = 0.0
    blocked_s: float = 0.0
    held_s: float = 0.0
    bytes: int = 0


class Span(NamedTuple):
    """One ``next()`` call of a measured stage, on the wall clock (``time.time_ns()``, comparable across processes):
    the stage's id, the native id of the thread that pulled it, when it started and ended, and whether it
    gave an item (False: a not-ready marker)."""

    stage_id: int
    thread_id: int
    start_ns: int
    end_ns: int
    ready: bool


class MetricsContext:
    """Counters, timers and info of one running dataflow.

    ``counters`` maps a name to an int (missing names read as 0), ``timers`` a name to a
    :class:`TimerStat`, ``info`` holds anything an operator wants to report, and
    ``current_actor`` is the actor that produced the item being processed (set by the
    parallel gathers, read by ``zip_with_source_actor``); ``stage_stats`` maps a
    :class:`~flowrl.iterators.StageNode` id to its :class:`StageStats`; ``latencies`` holds
    the gathers' request-to-arrival times per shard.
    """

    def __init__(self) -> None:
        self.counters: collections.defaultdict[str, int] = collections.defaultdict(int)
        self.timers: collections.defaultdict[str, TimerStat] = collections.defaultdict(TimerStat)
        self.info: dict[str, Any] = {}
        self.current_actor: Any = None
        self.stage_stats: collections.defaultdict[int, StageStats] = collections.defaultdict(StageStats)
        #: Whether the dataflow measures its stages (``stage_stats``, ``latencies``); read when an iterator starts.
        self.profile = True
        #: Seconds from a request to a shard until its item arrived, per ``"<parallel iterator>[<shard>]"``,
        #: appended by the gathers while ``profile`` is on (a reader drains them).
        self.latencies: collections.defaultdict[str, list[float]] = collections.defaultdict(list)
        #: While a list (set by whoever traces an iteration; None: off), each measured stage appends a
        #: :class:`Span` per ``next()`` call, in any thread that pulls it.
        self.spans: list[Span] | None = None

    def save(self) -> tuple[dict[str, int], dict[str, Any]]:
        """Return a picklable copy of the counters and info (timers are not state)."""
        return dict(self.counters), dict(self.info)

    def restore(self, state: tuple[dict[str, int], dict[str, Any]]) -> None:
        """Restore counters and info saved by :meth:`save`."""
        counters, info = state
        self.counters.clear()
        self.counters.update(counters)
        self.info = dict(info)

    def __repr__(self) -> str:
        return f"MetricsContext(counters={dict(self.counters)}, info={self.info})"


class SharedMetrics:
    """A holder of one :class:`MetricsContext`, shared by the iterators of a dataflow.

    Iterators keep the holder rather than the context so that :meth:`set` can re-point
    every iterator of a branch at once. A union's holder is linked to its children's
    holders, so re-pointing the union (when it is itself unioned) re-points them too.
    """

    def __init__(self, metrics: MetricsContext | None = None) -> None:
        self.metrics = metrics if metrics is not None else MetricsContext()
        self._linked: list[SharedMetrics] = []

    def set(self, metrics: MetricsContext) -> None:
        """Make every iterator holding this holder, or a linked one, use ``metrics``."""
        self.metrics = metrics
        for holder in self._linked:
            holder.set(metrics)

    def link(self, other: "SharedMetrics") -> None:
        """Have :meth:`set` on this holder also set ``other``."""
        if other is not self:
            self._linked.append(other)

    def get(self) -> MetricsContext:
        """The context currently held."""
        return self.metrics


class _ThreadMetrics(threading.local):
    """Per thread: the context of the iterator computing an item there (None outside one)."""

    # A class attribute is the default every new thread starts from.
    metrics: MetricsContext | None = None


_local = _ThreadMetrics()


def current_metrics() -> MetricsContext:
    """The context of the iterator computing an item in this thread.

    Raises :class:`IteratorUsageError` when called outside a running iterator.
    """
    metrics = _local.metrics
    if metrics is None:
        raise IteratorUsageError(
            "LocalIterator.get_metrics() was called outside a running iterator: metrics "
            "exist only while an iterator computes an item, so call it from inside a "
            "function passed to for_each/filter/transform (or an operator they run)."
        )
    return metrics


def swap_current_metrics(metrics: MetricsContext | None) -> MetricsContext | None:
    """Install ``metrics`` for this thread and return what was installed before."""
    previous = _local.metrics
    _local.metrics = metrics
    return previous


class _ThreadTiming(threading.local):
    """Per thread: one frame per measured stage being pulled, innermost last.

    A frame holds the seconds the stage spent pulling from measured stages below it, then
    the seconds of its own time spent waiting for input, fetching arrived results and blocked on
    output, and the seconds it held an item back (added by :func:`account`).
    """

    def __init__(self) -> None:
        self.stack: list[list[float]] = []


_timing = _ThreadTiming()

#: What :func:`account` attributes an interval to (positions in a timing frame): part of the stage's own
#: time spent waiting for input (``WAITING``), fetching arrived results (``TRANSFERRING``) or blocked on
#: output in place (``BLOCKED``: what consumes its output has no room), or, outside its own time, how long it
#: held an item back while the dataflow ran other branches (``HELD``: a full queue, a sibling behind).
WAITING, TRANSFERRING, BLOCKED, HELD = 1, 2, 3, 4


def account(kind: int, seconds: float) -> None:
    """Attribute ``seconds`` of the stage being pulled in this thread to ``kind`` (:data:`WAITING`,
    :data:`TRANSFERRING`, :data:`BLOCKED` or :data:`HELD`); outside a measured stage it is dropped."""
    stack = _timing.stack
    if stack:
        stack[-1][kind] += seconds
