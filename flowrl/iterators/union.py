"""Unions of local iterators, and waiting on sources that have no item yet.

Sources that must not block (the children of a union) are built with ``timeout=0`` and
yield a :class:`NextValueNotReady` marker when they have nothing yet. The marker carries
what the source waits on (Ray object refs, threading events), so a union that finds all
of its children idle blocks on exactly those instead of polling (:class:`_Waiter`).
:func:`_async_base` and :func:`_round_robin_base` are the base iterators of
:meth:`LocalIterator.union() <flowrl.iterators.LocalIterator.union>`.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterable, Iterator, Sequence

from flowrl.deferred import ray
from flowrl.errors import IteratorUsageError
from flowrl.iterators.metrics import WAITING, account


class SiblingProgress:
    """How many items a ``duplicate``'s children have taken or fetched so far: sibling iterators
    can make progress that no union sees (an item a filter drops, a batch still being
    concatenated), and a count that moved between two idle passes tells a wait from a deadlock."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


class NextValueNotReady:
    """Marker yielded (never raised) by a non-blocking source that has no item yet.

    ``object_refs`` are Ray object refs, one of which must complete before the source can
    make progress; ``events`` are :class:`threading.Event` objects set when it may have
    an item. A marker with neither ("bare") names nothing to wait on; with
    ``waits_on_siblings`` it says the source waits for other iterators of the same
    dataflow to consume (a ``duplicate`` child that is ahead of the others), whose
    ``progress`` counters show whether those siblings moved.
    """

    __slots__ = ("object_refs", "events", "waits_on_siblings", "progress")

    def __init__(
        self,
        object_refs: Sequence[ray.ObjectRef[Any]] = (),
        events: Sequence[threading.Event] = (),
        waits_on_siblings: bool = False,
        progress: Sequence[SiblingProgress] = (),
    ) -> None:
        self.object_refs = tuple(object_refs)
        self.events = tuple(events)
        self.waits_on_siblings = waits_on_siblings
        self.progress = tuple(progress)

    @property
    def is_bare(self) -> bool:
        """True when the marker names nothing to wait on."""
        return not self.object_refs and not self.events

    @staticmethod
    def merge(markers: Iterable["NextValueNotReady"]) -> "NextValueNotReady":
        """One marker that waits on everything the given markers wait on."""
        markers = list(markers)
        refs: dict[ray.ObjectRef[Any], None] = {}
        events: dict[threading.Event, None] = {}
        progress: dict[SiblingProgress, None] = {}
        for marker in markers:
            refs.update(dict.fromkeys(marker.object_refs))
            events.update(dict.fromkeys(marker.events))
            progress.update(dict.fromkeys(marker.progress))
        on_siblings = bool(markers) and all(m.waits_on_siblings for m in markers)
        return NextValueNotReady(list(refs), list(events), on_siblings, list(progress))

    def __repr__(self) -> str:
        return f"NextValueNotReady(refs={len(self.object_refs)}, events={len(self.events)})"


class _Waiter:
    """Blocks until one of a set of not-ready sources may have an item.

    Ray refs alone: one ``ray.wait``; one event alone: ``Event.wait`` (each for at most a
    second at a time).
    Mixed handles, several events, or only bare markers cannot be waited on as one, so
    those poll with a capped exponential backoff (1 ms doubling to 20 ms), which keeps an
    idle driver under ~1% of a core.
    """

    _MIN_DELAY_S = 0.001
    _MAX_DELAY_S = 0.02
    _RECHECK_S = 1.0

    def __init__(self) -> None:
        self._delay = self._MIN_DELAY_S
        self._sibling_counts: list[int] | None = None

    def reset(self) -> None:
        """Forget the backoff after a source made progress."""
        self._delay = self._MIN_DELAY_S
        self._sibling_counts = None

    def wait(self, markers: Sequence[NextValueNotReady]) -> None:
        """Return once progress may be possible for one of ``markers`` (time the stage spent waiting for input)."""
        start = time.perf_counter()
        try:
            self._block(markers)
        finally:
            account(WAITING, time.perf_counter() - start)

    def _block(self, markers: Sequence[NextValueNotReady]) -> None:
        merged = NextValueNotReady.merge(markers)
        if merged.waits_on_siblings:
            # Siblings that moved since the last idle pass (or a first idle pass) may have
            # made an item ready out of the caller's sight: pass again before calling it a deadlock.
            counts = [p.count for p in merged.progress]
            if counts != self._sibling_counts:
                self._sibling_counts = counts
                return
            raise IteratorUsageError(
                "deadlock: every source of this iterator waits for a sibling duplicate() iterator "
                "to consume, and none of those siblings is pulled here; put all children of a "
                "duplicate() into the same union (or Concurrently)."
            )
        refs, events = list(merged.object_refs), merged.events
        # Both waits are bounded, so a source waiting on an actor gets to check its deadline
        # (a shard timeout) and one waiting on a thread to re-check that the thread is alive.
        if refs and not events:
            ray.wait(refs, num_returns=1, timeout=self._RECHECK_S)
            return
        if len(events) == 1 and not refs:
            events[0].wait(timeout=self._RECHECK_S)
            return
        if any(event.is_set() for event in events):
            return
        if refs:
            ray.wait(refs, num_returns=1, timeout=self._delay)
        else:
            time.sleep(self._delay)
        self._delay = min(2 * self._delay, self._MAX_DELAY_S)

    def after_pass(
        self, markers: Sequence[NextValueNotReady], moved: bool, timeout: float | None
    ) -> NextValueNotReady | None:
        """End a union's pass over its children: when one ``moved`` (gave an item or ended), forget the backoff;
        when none did, return one marker for them all to yield (non-blocking, ``timeout`` not None) or block
        until one may (None: nothing to yield)."""
        if moved:
            self.reset()
        elif timeout is not None:
            return NextValueNotReady.merge(markers)
        else:
            self.wait(markers)
        return None


def _check_weights(weights: Sequence[int | str] | None, n: int) -> list[int | None] | None:
    """Validate ``round_robin_weights``; ``"*"`` comes back as None (take all that is ready)."""
    if weights is None:
        return None
    weights = list(weights)
    if len(weights) != n:
        raise IteratorUsageError(f"round_robin_weights={weights} has {len(weights)} entries for {n} iterators")
    checked: list[int | None] = []
    for w in weights:
        if w == "*":
            checked.append(None)
        elif isinstance(w, int) and w >= 1:
            checked.append(w)
        else:
            raise IteratorUsageError(
                f"round_robin_weights={weights}: each weight must be an int >= 1 or '*', got {w!r}"
            )
    return checked


def _async_base(children: Sequence[Iterator[Any]]) -> Callable[[float | None], Iterator[Any]]:
    """Whatever child has an item, blocking (on the children's pending refs or events) only when none has."""

    def base(timeout: float | None) -> Iterator[Any]:
        active = list(children)
        waiter = _Waiter()
        while active:
            markers: list[NextValueNotReady] = []
            progressed = False
            for child in list(active):
                try:
                    item = next(child)
                except StopIteration:
                    active.remove(child)
                    progressed = True
                    continue
                if isinstance(item, NextValueNotReady):
                    markers.append(item)
                else:
                    progressed = True
                    yield item
            marker = waiter.after_pass(markers, progressed or not active, timeout)
            if marker is not None:
                yield marker

    return base


def _round_robin_base(
    children: Sequence[Iterator[Any]], weights: Sequence[int | None]
) -> Callable[[float | None], Iterator[Any]]:
    """Round robin taking ``weights[i]`` items per turn from child ``i`` (None: all it has ready)."""

    def base(timeout: float | None) -> Iterator[Any]:
        active = list(zip(children, weights))
        waiter = _Waiter()
        while active:
            markers: list[NextValueNotReady] = []
            progressed = False
            for entry in list(active):
                child, weight = entry
                taken = 0
                while weight is None or taken < weight:
                    try:
                        item = next(child)
                    except StopIteration:
                        active.remove(entry)
                        progressed = True
                        break
                    if not isinstance(item, NextValueNotReady):
                        taken += 1
                        progressed = True
                        yield item
                    elif weight is None or item.is_bare:
                        # "*" (None) takes only what is ready; a bare marker waits on a sibling.
                        markers.append(item)
                        break
                    elif timeout is not None:
                        yield item  # keep the order: retry this child when resumed
                    else:
                        waiter.wait([item])
            marker = waiter.after_pass(markers, progressed or not active, timeout)
            if marker is not None:
                yield marker

    return base
