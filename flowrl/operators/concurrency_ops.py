"""Running sub-flows side by side, and handing items to and from background threads."""

from __future__ import annotations

import queue
import time
from typing import Any, Callable, Iterator, Sequence

from flowrl.errors import FlowRLError
from flowrl.iterators import EventQueue, LocalIterator, NextValueNotReady, SharedMetrics, StageNode, as_event_queue
from flowrl.iterators.local import StreamTransform
from flowrl.iterators.metrics import HELD, WAITING, account
from flowrl.operators.protocol import ActorLink, HiddenOperator, Operator

CONCURRENCY_MODES = ("round_robin", "async")


class _Tag(HiddenOperator):
    """Pairs an item with the index of the sub-flow it came from (internal plumbing)."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __call__(self, item: Any) -> tuple[int, Any]:
        return self.index, item


class _KeepOutputs(HiddenOperator):
    """Keeps the tagged items of the sub-flows whose outputs the merged flow yields."""

    def __init__(self, indexes: Sequence[int]) -> None:
        self.indexes = set(indexes)

    def __call__(self, tagged: tuple[int, Any]) -> bool:
        return tagged[0] in self.indexes


class _Untag(HiddenOperator):
    """Drops the sub-flow index again."""

    def __call__(self, tagged: tuple[int, Any]) -> Any:
        return tagged[1]


def Concurrently(
    ops: Sequence[LocalIterator[Any]],
    *,
    mode: str = "round_robin",
    output_indexes: Sequence[int] | None = None,
    round_robin_weights: Sequence[int | str] | None = None,
) -> LocalIterator[Any]:
    """Run sub-flows together and merge their outputs into one iterator.

    ``round_robin``: a fixed order, ``round_robin_weights[i]`` items from sub-flow ``i``
    per turn (``"*"``: all it has ready). ``async``: whichever sub-flow has an item; the
    merged flow blocks only when none has. ``output_indexes`` keeps only the outputs of
    those sub-flows (the others still run for their effects).
    """
    if len(ops) < 2:
        raise FlowRLError(f"Concurrently needs at least 2 sub-flows, got {len(ops)}")
    if mode not in CONCURRENCY_MODES:
        raise FlowRLError(f"Concurrently(mode={mode!r}): mode must be one of {CONCURRENCY_MODES}")
    if mode == "async" and round_robin_weights is not None:
        raise FlowRLError("Concurrently: round_robin_weights only apply to mode='round_robin'")
    if output_indexes is not None:
        bad = [i for i in output_indexes if not 0 <= i < len(ops)]
        if bad:
            raise FlowRLError(f"Concurrently: output_indexes {bad} out of range for {len(ops)} sub-flows")
        ops = [op.for_each(_Tag(i)) for i, op in enumerate(ops)]
    merged = ops[0].union(*ops[1:], deterministic=(mode == "round_robin"), round_robin_weights=round_robin_weights)
    if output_indexes is None:
        return merged
    return merged.filter(_KeepOutputs(output_indexes)).for_each(_Untag())


class Enqueue(StreamTransform, Operator):
    """Put each item on a bounded :class:`~flowrl.iterators.EventQueue` (or a standard
    ``queue.Queue``, which becomes one in place: see :func:`~flowrl.iterators.as_event_queue`).

    ``flow.transform(Enqueue(q))`` yields each item once it is on the queue, and so does
    ``flow.for_each(Enqueue(q))`` as RLlib Flow plans write it (a stream transform, which
    ``for_each`` applies as ``transform``). While the queue is full it yields a not-ready
    marker that waits on the queue's ``not_full_event`` and keeps the item, so nothing is
    dropped and a union meanwhile serves its other sub-flows (back-pressure instead of loss).
    """

    def __init__(self, output_queue: queue.Queue[Any]) -> None:
        self.queue: EventQueue[Any] = as_event_queue(output_queue)

    def plan_links(self) -> list[ActorLink]:
        """Feeds the learner thread's queue."""
        return [ActorLink("LearnerThread", "enqueue")]

    def __call__(self, items: Iterator[Any]) -> Iterator[Any]:
        for item in items:
            if isinstance(item, NextValueNotReady):
                yield item
                continue
            full_since: float | None = None
            while True:
                try:
                    self.queue.put_nowait(item)
                    break
                except queue.Full:
                    full_since = full_since or time.perf_counter()
                    yield NextValueNotReady(events=[self.queue.not_full_event])
            if full_since is not None:  # held while the plan ran other branches: back-pressure
                account(HELD, time.perf_counter() - full_since)
            yield item


def Dequeue(input_queue: queue.Queue[Any], check: Callable[[], bool] = lambda: True) -> LocalIterator[Any]:
    """A source of the items a background thread puts on ``input_queue`` (an
    :class:`~flowrl.iterators.EventQueue`, or a standard ``queue.Queue``, which becomes one in
    place, so the producer's puts wake the source: see :func:`~flowrl.iterators.as_event_queue`).

    Blocking consumers wait on the queue; inside a union it yields a not-ready marker on
    the queue's ``not_empty_event``. ``check()`` (e.g. "the learner thread is alive") is
    called whenever the queue is empty; if it returns False the source raises instead of
    waiting forever.
    """
    events = as_event_queue(input_queue)

    def base(timeout: float | None) -> Iterator[Any]:
        while True:
            try:
                yield events.get_nowait()
                continue
            except queue.Empty:
                pass
            if not check():
                raise FlowRLError("Dequeue: the queue is empty and its producer is gone (check() returned False)")
            if timeout is None:
                started = time.perf_counter()
                events.not_empty_event.wait(timeout=1.0)  # wake up now and then to re-run check()
                account(WAITING, time.perf_counter() - started)
            else:
                yield NextValueNotReady(events=[events.not_empty_event])

    return LocalIterator(
        base, SharedMetrics(), name="dequeue", stages=[StageNode("source", "dequeue", (), _LearnerResults())]
    )


class _LearnerResults(Operator):
    """Marks a Dequeue source in the plan graph as reading a learner thread's results."""

    def plan_links(self) -> list[ActorLink]:
        """Takes the learner thread's results."""
        return [ActorLink("LearnerThread", "take results")]
