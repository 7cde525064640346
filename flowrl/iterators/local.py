"""Lazy, pull-based iterators that run in the current process.

A :class:`LocalIterator` is a *definition* until its first item is pulled: a base iterator
(a function of a timeout returning an iterable) plus a list of transforms. Every
combinator returns a new definition, so a plan can be built, printed and shipped to a Ray
task before anything runs. Each combinator records a stage of the graph, which
:mod:`flowrl.iterators.stages` defines and measures as items flow.

Sources that must not block (the children of a union) yield a :class:`NextValueNotReady`
marker when they have nothing yet (see :mod:`flowrl.iterators.union`, which merges them).
"""

from __future__ import annotations

import collections
import random
import time
from typing import Any, Callable, Generic, Iterable, Iterator, Sequence, TypeVar

# typing.NamedTuple accepts Generic only from Python 3.11; this backport accepts it on 3.10 too.
from typing_extensions import NamedTuple

from flowrl.errors import IteratorUsageError
from flowrl.iterators.metrics import (
    HELD,
    MetricsContext,
    SharedMetrics,
    account,
    current_metrics,
    swap_current_metrics,
)
from flowrl.iterators.stages import StageNode, _measured, callable_name
from flowrl.iterators.union import (
    NextValueNotReady,
    SiblingProgress,
    _async_base,
    _check_weights,
    _round_robin_base,
    _Waiter,
)

T = TypeVar("T")
U = TypeVar("U")

Transform = Callable[[Iterator[Any]], Iterator[Any]]
BaseIterator = Callable[[float | None], Iterable[Any]]


def _skip_markers(fn: Callable[[Any], Any]) -> Transform:
    """A transform applying ``fn`` to items and passing not-ready markers through."""

    def apply(it: Iterator[Any]) -> Iterator[Any]:
        for item in it:
            yield item if isinstance(item, NextValueNotReady) else fn(item)

    return apply


class StreamTransform:
    """Base of callables that map the whole item stream (``Iterator -> Iterator``, passing
    :class:`NextValueNotReady` on), such as a hand-off to a bounded queue: ``for_each`` of one
    applies it as :meth:`LocalIterator.transform`, since mapping each item through it would
    only make generators that nothing runs."""

    def __call__(self, items: Iterator[Any]) -> Iterator[Any]:
        raise NotImplementedError


class FromActor(NamedTuple, Generic[T]):
    """An item and the Ray actor (handle) it came from, as ``zip_with_source_actor()`` yields them.

    Still a tuple, so ``actor, item = pair`` unpacks it.
    """

    actor: Any
    item: T


class LocalIterator(Generic[T]):
    """A lazy iterator in this process: a base iterator plus transforms, built on first pull.

    ``base_iterator(timeout)`` returns the source iterable; ``timeout=None`` asks it to
    block for items, ``timeout=0`` to yield :class:`NextValueNotReady` instead. Every
    iterator of one dataflow shares a :class:`SharedMetrics` holder, installed for the
    thread while an item is computed (see :meth:`get_metrics`).
    """

    def __init__(
        self,
        base_iterator: BaseIterator,
        shared_metrics: SharedMetrics | None = None,
        local_transforms: Sequence[Transform] = (),
        timeout: float | None = None,
        name: str | None = None,
        stages: Sequence[StageNode] | None = None,
    ) -> None:
        self.base_iterator = base_iterator
        self.shared_metrics = shared_metrics if shared_metrics is not None else SharedMetrics()
        self.local_transforms = list(local_transforms)
        self.timeout = timeout
        self.name = name or "LocalIterator"
        if stages is None:
            source = StageNode("source", self.name)
            stages = [source]
            for transform in self.local_transforms:
                stages.append(StageNode("transform", callable_name(transform), (stages[-1],), transform))
        if len(stages) != len(self.local_transforms) + 1:
            raise IteratorUsageError(f"stages: need one node for the source and one per transform, got {len(stages)}")
        self.stages = list(stages)
        self._built: Iterator[T] | None = None

    # -- running ---------------------------------------------------------------------

    @staticmethod
    def get_metrics() -> MetricsContext:
        """The metrics context of the iterator computing the current item.

        Call it from functions passed to combinators; outside a running iterator it raises
        :class:`~flowrl.errors.IteratorUsageError`.
        """
        return current_metrics()

    def __iter__(self) -> "LocalIterator[T]":
        return self

    @property
    def stage(self) -> StageNode:
        """The graph node of this iterator's last stage (walk ``inputs`` for the rest)."""
        return self.stages[-1]

    def __next__(self) -> T:
        metrics = self.shared_metrics.get()
        previous = swap_current_metrics(metrics)
        try:
            if self._built is None:
                stats = metrics.stage_stats
                it: Iterator[Any] = iter(self.base_iterator(self.timeout))
                if metrics.profile:
                    it = _measured(it, stats[self.stages[0].id], self.stages[0].id, metrics)
                for transform, stage in zip(self.local_transforms, self.stages[1:]):
                    it = (
                        _measured(transform(it), stats[stage.id], stage.id, metrics)
                        if metrics.profile
                        else transform(it)
                    )
                self._built = it
            return next(self._built)
        finally:
            swap_current_metrics(previous)

    @property
    def started(self) -> bool:
        """Whether an item was pulled (the definition can no longer be extended)."""
        return self._built is not None

    def take(self, n: int) -> list[T]:
        """Pull up to ``n`` items (fewer if the iterator ends) and return them."""
        items: list[T] = []
        while len(items) < n:
            try:
                item = next(self)
            except StopIteration:
                break
            if not isinstance(item, NextValueNotReady):
                items.append(item)
        return items

    def show(self, n: int = 20) -> None:
        """Print up to ``n`` items, one per line."""
        for item in self.take(n):
            print(item)

    # -- definition ------------------------------------------------------------------

    def _check_not_started(self, what: str) -> None:
        if self._built is not None:
            raise IteratorUsageError(
                f"{self!r}{what}: the iterator has already produced items, so its definition "
                "can no longer be extended; build the whole chain before pulling from it."
            )

    def _copy(self, timeout: float | None) -> "LocalIterator[T]":
        return LocalIterator(
            self.base_iterator, self.shared_metrics, self.local_transforms, timeout, self.name, self.stages
        )

    def _renamed(self, name: str) -> "LocalIterator[T]":
        return LocalIterator(
            self.base_iterator, self.shared_metrics, self.local_transforms, self.timeout, name, self.stages
        )

    def _chain(self, transform: Transform, suffix: str, fn: Any = None) -> "LocalIterator[Any]":
        """Append ``transform``; ``suffix`` (``".for_each()"``) names it, ``fn`` is what it applies."""
        self._check_not_started(suffix)
        kind = suffix.lstrip(".").split("(")[0]
        label = f"{kind}({callable_name(fn)})" if fn is not None else suffix.lstrip(".")
        return LocalIterator(
            self.base_iterator,
            self.shared_metrics,
            self.local_transforms + [transform],
            self.timeout,
            self.name + suffix,
            self.stages + [StageNode(kind, label, (self.stage,), fn)],
        )

    def transform(self, fn: Callable[[Iterator[T]], Iterator[U]]) -> "LocalIterator[U]":
        """Apply ``fn`` to the whole item stream (``fn`` must pass ``NextValueNotReady`` on)."""
        return self._chain(fn, ".transform()", fn)

    def for_each(self, fn: Callable[[T], U]) -> "LocalIterator[U]":
        """Map each item through ``fn`` (a :class:`StreamTransform` is applied as :meth:`transform`)."""
        if isinstance(fn, StreamTransform):
            return self.transform(fn)
        return self._chain(_skip_markers(fn), ".for_each()", fn)

    def filter(self, fn: Callable[[T], bool]) -> "LocalIterator[T]":
        """Keep the items for which ``fn`` is true."""

        def apply(it: Iterator[Any]) -> Iterator[Any]:
            for item in it:
                if isinstance(item, NextValueNotReady) or fn(item):
                    yield item

        return self._chain(apply, ".filter()", fn)

    def batch(self, n: int) -> "LocalIterator[list[T]]":
        """Group items into lists of ``n`` (the last list may be shorter)."""
        if n < 1:
            raise IteratorUsageError(f"batch(n={n}): n must be a positive number of items")

        def apply(it: Iterator[Any]) -> Iterator[Any]:
            buffer: list[Any] = []
            for item in it:
                if isinstance(item, NextValueNotReady):
                    yield item
                    continue
                buffer.append(item)
                if len(buffer) >= n:
                    yield buffer
                    buffer = []
            if buffer:
                yield buffer

        return self._chain(apply, f".batch({n})")

    def flatten(self) -> "LocalIterator[Any]":
        """Yield the elements of each (iterable) item in turn."""

        def apply(it: Iterator[Any]) -> Iterator[Any]:
            for item in it:
                if isinstance(item, NextValueNotReady):
                    yield item
                else:
                    yield from item

        return self._chain(apply, ".flatten()")

    def combine(self, fn: Callable[[T], Iterable[U]]) -> "LocalIterator[U]":
        """Flat-map: yield every element of ``fn(item)`` for each item (possibly none)."""

        def apply(it: Iterator[Any]) -> Iterator[Any]:
            for item in it:
                if isinstance(item, NextValueNotReady):
                    yield item
                else:
                    yield from fn(item)

        return self._chain(apply, ".combine()", fn)

    def shuffle(self, shuffle_buffer_size: int, seed: int | None = None) -> "LocalIterator[T]":
        """Shuffle through a buffer of ``shuffle_buffer_size`` items (a local, streaming shuffle)."""
        if shuffle_buffer_size < 1:
            raise IteratorUsageError(f"shuffle(shuffle_buffer_size={shuffle_buffer_size}): must be >= 1")

        def apply(it: Iterator[Any]) -> Iterator[Any]:
            rng = random.Random(seed)
            buffer: list[Any] = []
            for item in it:
                if isinstance(item, NextValueNotReady):
                    yield item
                    continue
                buffer.append(item)
                if len(buffer) >= shuffle_buffer_size:
                    yield buffer.pop(rng.randrange(len(buffer)))
            rng.shuffle(buffer)
            yield from buffer

        return self._chain(apply, ".shuffle()")

    def zip_with_source_actor(self) -> "LocalIterator[FromActor[T]]":
        """Yield each item as ``FromActor(actor, item)``, ``actor`` being the actor it came from.

        Use right after a parallel gather, which records the actor of each item it fetches.
        """

        def pair(item: T) -> FromActor[T]:
            return FromActor(current_metrics().current_actor, item)

        return self._chain(_skip_markers(pair), ".zip_with_source_actor()")

    def duplicate(self, n: int, max_buffer: int = 10_000) -> list["LocalIterator[T]"]:
        """Split into ``n`` iterators that each see every item.

        Back-pressure: inside a union (non-blocking), a child that is ahead of a sibling
        yields a bare :class:`NextValueNotReady` until the sibling catches up, so children
        move in lockstep. A child pulled on its own (blocking) may run ahead, but raises
        :class:`~flowrl.errors.IteratorUsageError` rather than buffer more than
        ``max_buffer`` items for a sibling that never consumes them.
        """
        if n < 1:
            raise IteratorUsageError(f"duplicate(n={n}): n must be >= 1")
        self._check_not_started(f".duplicate({n})")
        source = self._copy(timeout=0)
        queues: list[collections.deque[Any]] = [collections.deque() for _ in range(n)]
        progress = SiblingProgress()

        def make_base(index: int) -> BaseIterator:
            def base(timeout: float | None) -> Iterator[Any]:
                own = queues[index]
                waiter = _Waiter()
                held_since: float | None = None  # since when it is ahead of a sibling that has not consumed
                while True:
                    lead = 0 if own else max((len(q) for j, q in enumerate(queues) if j != index), default=0)
                    if lead > 0 and timeout is not None:
                        held_since = held_since or time.perf_counter()
                        yield NextValueNotReady(waits_on_siblings=True, progress=[progress])
                        continue
                    if held_since is not None:  # back-pressure from the slower sibling, over once it moves on
                        account(HELD, time.perf_counter() - held_since)
                        held_since = None
                    if own:
                        progress.count += 1
                        yield own.popleft()
                        continue
                    try:
                        item = next(source)
                    except StopIteration:
                        return
                    if isinstance(item, NextValueNotReady):
                        if timeout is not None:
                            yield item
                        else:
                            waiter.wait([item])
                        continue
                    if lead >= max_buffer:
                        raise IteratorUsageError(
                            f"{self.name}.duplicate({n}) child {index} ran {lead} items ahead of a "
                            f"sibling (max_buffer={max_buffer}); consume duplicated iterators together, "
                            "e.g. through union() or Concurrently."
                        )
                    waiter.reset()
                    progress.count += 1
                    for j, q in enumerate(queues):
                        if j != index:
                            q.append(item)
                    yield item

            return base

        return [
            LocalIterator(
                make_base(i),
                self.shared_metrics,
                (),
                self.timeout,
                f"{self.name}.duplicate[{i}]",
                [StageNode("duplicate", f"duplicate[{i}]", (self.stage,))],
            )
            for i in range(n)
        ]

    def union(
        self,
        *others: "LocalIterator[Any]",
        deterministic: bool = False,
        round_robin_weights: Sequence[int | str] | None = None,
    ) -> "LocalIterator[Any]":
        """Merge this iterator with ``others`` into one stream sharing one metrics context.

        ``deterministic=False`` yields whatever child has an item, blocking (on the
        children's pending refs or events) only when none has. ``deterministic=True`` takes
        items in round-robin order, ``round_robin_weights[i]`` at a time from child ``i``
        (default 1 each); a weight of ``"*"`` takes all the items that child has ready.
        Giving weights implies ``deterministic=True``. Exhausted children drop out.
        """
        iterators: list[LocalIterator[Any]] = [self, *others]
        for it in iterators:
            if not isinstance(it, LocalIterator):
                raise IteratorUsageError(
                    f"union() takes LocalIterators, got {type(it).__name__}: gather a ParallelIterator "
                    "first (gather_sync()/gather_async()), or use ParallelIterator.union for parallel ones."
                )
            it._check_not_started(".union()")
        weights = _check_weights(round_robin_weights, len(iterators))
        if weights is not None:
            deterministic = True
        holder = SharedMetrics(self.shared_metrics.get())
        for it in iterators:
            it.shared_metrics.set(holder.get())
            holder.link(it.shared_metrics)
        children = [it._copy(timeout=0) for it in iterators]
        if deterministic:
            base = _round_robin_base(children, weights or [1] * len(children))
        else:
            base = _async_base(children)
        mode = "deterministic" if deterministic else "async"
        names = ", ".join(it.name for it in iterators)
        node = StageNode("union", f"union[{mode}]", tuple(it.stage for it in iterators))
        return LocalIterator(base, holder, (), self.timeout, f"union[{mode}]({names})", [node])

    # -- pickling and printing -------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        if self._built is not None:
            raise IteratorUsageError(
                f"{self!r} has already produced items and cannot be sent to another process; "
                "send the iterator before pulling from it."
            )
        return dict(self.__dict__)

    def __repr__(self) -> str:
        return f"LocalIterator[{self.name}]"
