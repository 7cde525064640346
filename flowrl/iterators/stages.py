"""The stages of a dataflow graph, and what each one measures as items flow through it.

Every combinator of a :class:`~flowrl.iterators.local.LocalIterator` records a :class:`StageNode`
(what the stage does, its inputs, the callable it applies), which is how a plan's graph is drawn
without running it. When the iterator runs, each stage's iterator is wrapped by :func:`_measured`,
which counts the items it yields, their bytes (:func:`item_nbytes`) and the time spent in the
stage's own code, into the :class:`~flowrl.iterators.metrics.StageStats` its ``id`` keys.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from flowrl.iterators.metrics import (
    BLOCKED,
    HELD,
    TRANSFERRING,
    WAITING,
    MetricsContext,
    Span,
    StageStats,
    _timing,
)
from flowrl.iterators.union import NextValueNotReady

_stage_ids = itertools.count(1)


@dataclass(eq=False)
class StageNode:
    """One stage of a dataflow graph, recorded as combinators are applied.

    ``kind`` says what the stage does (``"source"``, ``"for_each"``, ``"union"``,
    ``"gather_async"``, ...), ``label`` names it for people, ``inputs`` are the stages it
    pulls from, ``fn`` is the callable it applies (an operator, for plans) and ``actors``
    the Ray actors a source pulls from. ``id`` keys its :class:`StageStats`.
    """

    kind: str
    label: str
    inputs: tuple["StageNode", ...] = ()
    fn: Any = None
    actors: tuple[Any, ...] = ()
    id: int = field(default_factory=lambda: next(_stage_ids))


def callable_name(fn: Any) -> str:
    """A short name for a function or callable object (its class name for operators)."""
    name = getattr(fn, "__name__", None)
    return name if isinstance(name, str) else type(fn).__name__


def item_nbytes(item: Any) -> int:
    """The size an item reports (``size_bytes()``), summed over the items of a list or tuple; else 0."""
    size = getattr(item, "size_bytes", None)
    if size is not None:
        return int(size())
    if item.__class__ is list or isinstance(item, tuple):
        return sum(item_nbytes(x) for x in item)
    return 0


def _measured(it: Iterator[Any], stats: StageStats, stage_id: int, metrics: MetricsContext) -> Iterator[Any]:
    """Count the items a stage yields, their bytes, and the time spent in its own code.

    A per-thread stack of frames collects the time each stage spends pulling from the
    measured stages below it, which is subtracted from its own total, and the parts of its
    own time it spent blocked (:func:`account`). While ``metrics.spans`` is a list, each
    ``next()`` call that gives an item or a not-ready marker is also appended to it as a :class:`Span`.
    """
    stack = _timing.stack
    while True:
        frame = [0.0, 0.0, 0.0, 0.0, 0.0]
        stack.append(frame)
        spans = metrics.spans
        started_ns = time.time_ns() if spans is not None else 0
        start = time.perf_counter()
        try:
            item = next(it)
        except StopIteration:
            return
        finally:
            elapsed = time.perf_counter() - start
            stack.pop()
            stats.time_s += elapsed - frame[0]
            stats.wait_s += frame[WAITING]
            stats.transfer_s += frame[TRANSFERRING]
            stats.blocked_s += frame[BLOCKED]
            stats.held_s += frame[HELD]
            if stack:
                stack[-1][0] += elapsed
        ready = not isinstance(item, NextValueNotReady)
        if spans is not None:
            spans.append(Span(stage_id, threading.get_native_id(), started_ns, time.time_ns(), ready))
        if ready:
            stats.items += 1
            stats.bytes += item_nbytes(item)
        yield item
