"""Parallel iterators: one shard per Ray actor, transforms run inside the actors.

A :class:`ParallelIterator` records transforms; nothing runs until a gather
(:meth:`ParallelIterator.gather_sync`, :meth:`~ParallelIterator.gather_async`,
:meth:`~ParallelIterator.batch_across_shards`) or :meth:`~ParallelIterator.get_shard`
turns it into a :class:`~flowrl.iterators.LocalIterator` and that is pulled. Each gather
then opens its own stream on every shard actor (keyed by a fresh id), so several
gathers over the same actors do not steal each other's items.

Any Ray actor can serve shards by inheriting :class:`~flowrl.iterators.shards.ParallelIteratorWorker`
(:mod:`flowrl.iterators.shards`, which also holds one gather's streams on its shards).
"""

from __future__ import annotations

import collections
import inspect
import math
import time
from typing import Any, Callable, Generator, Generic, Iterable, Iterator, Sequence, TypeVar

from flowrl.deferred import ray
from flowrl.errors import IteratorUsageError
from flowrl.iterators.local import LocalIterator
from flowrl.iterators.metrics import TRANSFERRING, WAITING, SharedMetrics, account, current_metrics
from flowrl.iterators.shards import (
    _END,
    FailureHook,
    ItemSource,
    ShardSupervisor,
    ShardTransform,
    _ActorSet,
    _check_item_source,
    _remote_shard_actor,
    _Shard,
    _shard_failures,
    _ShardStreams,
    next_deadline,
    overdue,
    timed_out,
    wait_parked,
)
from flowrl.iterators.stages import StageNode
from flowrl.iterators.union import NextValueNotReady

T = TypeVar("T")
U = TypeVar("U")

#: What fetching an item gives, in the driver, when its shard failed and was replaced.
_RESTARTED = object()
#: Metrics counter of the items a ``batch_across_shards(min_fraction < 1)`` round did not wait
#: for, which joined a later round.
LATE_ITEMS_COUNTER = "num_late_items"


class ParallelIterator(Generic[T]):
    """A set of shards, one per Ray actor, with transforms that run inside those actors.

    Not iterable itself: turn it into a :class:`LocalIterator` with a gather, or take one
    shard with :meth:`get_shard`.
    """

    def __init__(
        self, actor_sets: list[_ActorSet], name: str, parent_iterators: Sequence["ParallelIterator[Any]"] = ()
    ) -> None:
        self.actor_sets = actor_sets
        self.name = name
        self.parent_iterators = list(parent_iterators)

    def __iter__(self) -> Iterator[T]:
        raise IteratorUsageError(
            f"{self!r} cannot be iterated directly: its items live in {self.num_shards()} shard actors. "
            "Use gather_sync(), gather_async() or batch_across_shards() to pull them into this "
            "process, or get_shard(i) for one shard."
        )

    def __repr__(self) -> str:
        return f"ParallelIterator[{self.name}]"

    # -- transforms (run inside the shard actors) ------------------------------------

    def _with_transform(self, transform: ShardTransform, suffix: str) -> "ParallelIterator[Any]":
        return ParallelIterator([s.with_transform(transform) for s in self.actor_sets], self.name + suffix, [self])

    def for_each(self, fn: Callable[[T], U]) -> "ParallelIterator[U]":
        """Map each item through ``fn`` inside its shard actor."""
        return self._with_transform(lambda it: it.for_each(fn), ".for_each()")

    def filter(self, fn: Callable[[T], bool]) -> "ParallelIterator[T]":
        """Keep, in each shard, the items for which ``fn`` is true."""
        return self._with_transform(lambda it: it.filter(fn), ".filter()")

    def batch(self, n: int) -> "ParallelIterator[list[T]]":
        """Group each shard's items into lists of ``n``."""
        if n < 1:
            raise IteratorUsageError(f"batch(n={n}): n must be a positive number of items")
        return self._with_transform(lambda it: it.batch(n), f".batch({n})")

    def flatten(self) -> "ParallelIterator[Any]":
        """Yield the elements of each (iterable) item, in each shard."""
        return self._with_transform(lambda it: it.flatten(), ".flatten()")

    def combine(self, fn: Callable[[T], Iterable[U]]) -> "ParallelIterator[U]":
        """Flat-map ``fn`` over each shard's items."""
        return self._with_transform(lambda it: it.combine(fn), ".combine()")

    def transform(self, fn: Callable[[Iterator[T]], Iterator[U]]) -> "ParallelIterator[U]":
        """Apply ``fn`` to each shard's whole item stream."""
        return self._with_transform(lambda it: it.transform(fn), ".transform()")

    def shuffle(self, shuffle_buffer_size: int, seed: int | None = None) -> "ParallelIterator[T]":
        """Shuffle each shard's items through a local buffer."""
        if shuffle_buffer_size < 1:
            raise IteratorUsageError(f"shuffle(shuffle_buffer_size={shuffle_buffer_size}): must be >= 1")
        return self._with_transform(lambda it: it.shuffle(shuffle_buffer_size, seed), ".shuffle()")

    # -- shards --------------------------------------------------------------------

    def _source_stage(self, kind: str) -> StageNode:
        actors = tuple(actor for actor_set in self.actor_sets for actor in actor_set.actors)
        return StageNode(kind, f"{kind}({self.name})", (), None, actors)

    def _shards(self) -> list[_Shard]:
        shards: list[_Shard] = []
        for actor_set in self.actor_sets:
            for actor in actor_set.actors:
                shards.append(actor_set.shard(len(shards), actor))
        return shards

    def num_shards(self) -> int:
        """How many shards (actors) the iterator spans."""
        return sum(len(s.actors) for s in self.actor_sets)

    def shards(self) -> list[LocalIterator[T]]:
        """One local iterator per shard."""
        return [self.get_shard(i) for i in range(self.num_shards())]

    def get_shard(self, shard_index: int) -> LocalIterator[T]:
        """A local iterator over shard ``shard_index`` alone (one actor call per item)."""
        num_shards = self.num_shards()
        if not 0 <= shard_index < num_shards:
            raise IteratorUsageError(f"get_shard({shard_index}): {self!r} has shards 0..{num_shards - 1}")
        selected = self.select_shards([shard_index])
        return selected.gather_sync()._renamed(f"{self.name}.shard[{shard_index}]")

    def select_shards(self, shards_to_keep: Sequence[int]) -> "ParallelIterator[T]":
        """A parallel iterator over the given shards only, in the given order."""
        shards = self._shards()
        for i in shards_to_keep:
            if not 0 <= i < len(shards):
                raise IteratorUsageError(
                    f"select_shards({list(shards_to_keep)}): {self!r} has shards 0..{len(shards) - 1}"
                )
        sets = [
            _ActorSet(
                [shards[i].actor], shards[i].transforms, shards[i].on_failure, shards[i].timeout_s, shards[i].supervisor
            )
            for i in shards_to_keep
        ]
        return ParallelIterator(sets, f"{self.name}.select_shards({len(sets)} shards)", [self])

    def union(self, *others: "ParallelIterator[Any]") -> "ParallelIterator[Any]":
        """A parallel iterator whose shards are this one's followed by ``others``'."""
        for other in others:
            if not isinstance(other, ParallelIterator):
                raise IteratorUsageError(
                    f"ParallelIterator.union() takes ParallelIterators, got {type(other).__name__}; "
                    "gather first and use LocalIterator.union to mix with local iterators."
                )
        iterators = [self, *others]
        sets = [s for it in iterators for s in it.actor_sets]
        return ParallelIterator(sets, f"ParallelUnion[{', '.join(it.name for it in iterators)}]", iterators)

    # -- gathers ---------------------------------------------------------------------

    def _sync_rounds(self, timeout: float | None, min_fraction: float = 1.0) -> Iterator[Any]:
        """Yield, per round, a list of (shard, item) in shard order, or a not-ready marker.

        A round requests an item from every live shard that has none in flight and ends once
        ``ceil(min_fraction * live shards)`` of the items in flight arrived; the others stay
        in flight and join a later round (counted in ``LATE_ITEMS_COUNTER``). Parked shards (a
        replacement still starting) sit rounds out and join the first round after they started.
        """
        streams = _ShardStreams(self._shards(), self.name)
        # Per shard, its request in flight: (ref, when sent, round sent in).
        in_flight: dict[_Shard, tuple[ray.ObjectRef[Any], float, int]] = {}
        active = list(streams.live)
        round_number = 0
        try:
            while active or streams.parked:
                rejoined = streams.rejoined()
                if rejoined:
                    active = sorted(active + rejoined, key=lambda shard: shard.index)
                if not active:
                    if timeout is None:
                        wait_parked()
                    else:  # in a union: the other sources go on meanwhile
                        yield NextValueNotReady()
                    continue
                round_number += 1
                for shard in active:
                    if shard not in in_flight:
                        now = time.monotonic()
                        shard.requested(now)
                        in_flight[shard] = (streams.request(shard), now, round_number)
                done = yield from self._wait_round(streams, active, in_flight, timeout, min_fraction, round_number)
                round_items = self._collect_round(streams, active, in_flight, done, round_number)
                if round_items:
                    yield round_items
        finally:
            streams.close()

    def _wait_round(
        self,
        streams: _ShardStreams,
        active: list[_Shard],
        in_flight: dict[_Shard, tuple[ray.ObjectRef[Any], float, int]],
        timeout: float | None,
        min_fraction: float,
        round_number: int,
    ) -> Generator[NextValueNotReady, None, set[ray.ObjectRef[Any]]]:
        """Wait until enough of the round's items arrived, restarting shards past their timeout."""
        while True:
            refs = [in_flight[shard][0] for shard in active]
            if not refs:
                return set()
            need = max(1, math.ceil(min_fraction * len(refs)))
            started = time.perf_counter()
            done, pending = ray.wait(refs, num_returns=need, timeout=next_deadline(active, streams, timeout))
            account(WAITING, time.perf_counter() - started)
            if len(done) >= need:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
                return set(ready)
            expired = overdue({s: in_flight[s][0] for s in active})
            for shard in expired:
                del in_flight[shard]
                if streams.restart(shard, timed_out(shard)):
                    now = time.monotonic()
                    shard.requested(now)
                    in_flight[shard] = (streams.request(shard), now, round_number)
                else:
                    active.remove(shard)
            if not expired and timeout is not None:
                yield NextValueNotReady(pending)

    def _collect_round(
        self,
        streams: _ShardStreams,
        active: list[_Shard],
        in_flight: dict[_Shard, tuple[ray.ObjectRef[Any], float, int]],
        done: set[ray.ObjectRef[Any]],
        round_number: int,
    ) -> list[tuple[_Shard, Any]]:
        """The arrived items of the round, in shard order; failed shards are restarted or dropped."""
        arrived = [shard for shard in active if in_flight[shard][0] in done]
        started = time.perf_counter()
        try:
            results = ray.get([in_flight[shard][0] for shard in arrived])
        except _shard_failures():
            results = [self._fetch_one(streams, shard, in_flight[shard][0]) for shard in arrived]
        account(TRANSFERRING, time.perf_counter() - started)
        metrics = current_metrics()
        now = time.monotonic()
        round_items: list[tuple[_Shard, Any]] = []
        for shard, item in zip(arrived, results):
            _, sent_at, sent_in = in_flight.pop(shard)
            if metrics.profile:
                metrics.latencies[f"{self.name}[{shard.index}]"].append(now - sent_at)
            if item is _END:  # the shard's items ran out, or it failed and was dropped
                active.remove(shard)
                continue
            if item is _RESTARTED:  # its replacement is asked again next round
                continue
            if sent_in < round_number:
                metrics.counters[LATE_ITEMS_COUNTER] += 1
            round_items.append((shard, item))
        return round_items

    def _fetch_one(self, streams: _ShardStreams, shard: _Shard, ref: ray.ObjectRef[Any]) -> Any:
        """One arrived item; a failure restarts the shard (``_RESTARTED``) or drops it (``_END``)."""
        try:
            return ray.get(ref)
        except _shard_failures() as e:
            return _RESTARTED if streams.restart(shard, e) else _END

    def gather_sync(self) -> LocalIterator[T]:
        """Round-robin over the shards, one item from each per round, with a barrier per round.

        Deterministic. A shard's next item is requested only after all of this round's
        items were consumed downstream.
        """

        def base(timeout: float | None) -> Iterator[Any]:
            for round_items in self._sync_rounds(timeout):
                if isinstance(round_items, NextValueNotReady):
                    yield round_items
                    continue
                for shard, item in round_items:
                    current_metrics().current_actor = shard.actor
                    yield item

        return LocalIterator(
            base, SharedMetrics(), name=f"{self.name}.gather_sync()", stages=[self._source_stage("gather_sync")]
        )

    def batch_across_shards(self, min_fraction: float = 1.0) -> LocalIterator[list[T]]:
        """Yield one list per round holding the next item of every live shard.

        With ``min_fraction`` < 1 a round ends as soon as that fraction of the shards
        delivered (stragglers do not hold it up); the items still in flight are not lost but
        join a later round, each counted in the metrics counter ``num_late_items``.
        """
        if not 0 < min_fraction <= 1:
            raise IteratorUsageError(f"batch_across_shards(min_fraction={min_fraction}): must be in (0, 1]")

        def base(timeout: float | None) -> Iterator[Any]:
            for round_items in self._sync_rounds(timeout, min_fraction):
                if isinstance(round_items, NextValueNotReady):
                    yield round_items
                else:
                    yield [item for _, item in round_items]

        return LocalIterator(
            base,
            SharedMetrics(),
            name=f"{self.name}.batch_across_shards()",
            stages=[self._source_stage("batch_across_shards")],
        )

    def gather_async(self, num_async: int = 1) -> LocalIterator[T]:
        """Yield items as shards produce them, with ``num_async`` requests in flight per shard.

        Blocks on ``ray.wait`` over every pending request (no polling). A shard's next
        request is sent only after its previous item was consumed downstream, so with
        ``num_async=1`` a function applied after the gather has run on an actor's item
        before that actor is asked for the next one. The source actor of each item is
        recorded for :meth:`LocalIterator.zip_with_source_actor`. A shard replaced after a
        failure gets ``num_async`` fresh requests (a parked one once its actor has started).
        """
        if num_async < 1:
            raise IteratorUsageError(f"gather_async(num_async={num_async}): must be >= 1 requests in flight per shard")

        def base(timeout: float | None) -> Iterator[Any]:
            streams = _ShardStreams(self._shards(), self.name)
            # Per shard, its requests in the order sent. An actor answers in that order, so
            # only the oldest request of each shard is waited on: items from one shard are
            # yielded in order even with num_async > 1. ``shard.since``: when the oldest
            # request became the one the actor works on (its timeout runs from then).
            queues: dict[_Shard, collections.deque[ray.ObjectRef[Any]]] = {}

            def refill(shard: _Shard) -> None:
                queues[shard] = collections.deque(streams.request(shard) for _ in range(num_async))
                shard.requested(time.monotonic())

            def restart(shard: _Shard, cause: BaseException) -> None:
                # Requests sent to the failed actor are abandoned; the replacement gets fresh ones.
                del queues[shard]
                if streams.restart(shard, cause):
                    refill(shard)

            for shard in streams.live:
                refill(shard)
            ready: list[_Shard] = []
            last: _Shard | None = None
            try:
                while queues or streams.parked:
                    if not ready:
                        for shard in streams.rejoined():
                            refill(shard)
                        expired = overdue({s: q[0] for s, q in queues.items()})
                        for shard in expired:
                            restart(shard, timed_out(shard))
                        if not queues:
                            if streams.parked and timeout is None:
                                wait_parked()
                            elif streams.parked:  # in a union: the other sources go on meanwhile
                                yield NextValueNotReady()
                            continue
                        heads = {q[0]: shard for shard, q in queues.items()}
                        refs = list(heads)
                        started = time.perf_counter()
                        done, _ = ray.wait(refs, num_returns=1, timeout=next_deadline(queues, streams, timeout))
                        account(WAITING, time.perf_counter() - started)
                        if not done:
                            if timeout is not None:
                                yield NextValueNotReady(refs)
                            continue
                        if len(refs) > 1 and heads[done[0]] is last:
                            # ray.wait does not pick fairly among ready refs: before serving
                            # the same shard twice in a row, serve every other one that is ready.
                            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
                        ready = sorted((heads[r] for r in done), key=lambda shard: shard is last)
                    shard = ready.pop(0)
                    ref = queues[shard].popleft()
                    now = time.monotonic()
                    metrics = current_metrics()
                    if metrics.profile:  # since the actor began this request: the latency a straggler stretches
                        metrics.latencies[f"{self.name}[{shard.index}]"].append(now - shard.since)
                    shard.requested(now)
                    started = time.perf_counter()
                    try:
                        item = ray.get(ref)
                    except _shard_failures() as e:
                        restart(shard, e)
                        continue
                    finally:
                        account(TRANSFERRING, time.perf_counter() - started)
                    if item is _END:
                        if not queues[shard]:
                            del queues[shard]
                        continue
                    last = shard
                    metrics.current_actor = shard.actor
                    yield item
                    if shard in queues:
                        queues[shard].append(streams.request(shard))
            finally:
                streams.close()

        return LocalIterator(
            base, SharedMetrics(), name=f"{self.name}.gather_async()", stages=[self._source_stage("gather_async")]
        )


def _check_num_shards(num_shards: int) -> None:
    if not isinstance(num_shards, int) or num_shards < 1:
        raise IteratorUsageError(f"num_shards={num_shards!r}: must be an int >= 1")


def from_items(items: Sequence[T], num_shards: int = 2, repeat: bool = False) -> ParallelIterator[T]:
    """A parallel iterator over ``items``, dealt round-robin into ``num_shards`` shard actors."""
    _check_num_shards(num_shards)
    items = list(items)
    shards = [items[i::num_shards] for i in range(num_shards)]
    return from_iterators(shards, repeat=repeat, name=f"from_items[{len(items)}, shards={num_shards}]")


def from_range(n: int, num_shards: int = 2, repeat: bool = False) -> ParallelIterator[int]:
    """A parallel iterator over ``range(n)``, split into ``num_shards`` contiguous ranges."""
    _check_num_shards(num_shards)
    bounds = [i * n // num_shards for i in range(num_shards + 1)]
    shards = [range(bounds[i], bounds[i + 1]) for i in range(num_shards)]
    return from_iterators(shards, repeat=repeat, name=f"from_range[{n}, shards={num_shards}]")


def from_iterators(
    generators: Sequence[ItemSource], repeat: bool = False, name: str | None = None
) -> ParallelIterator[Any]:
    """A parallel iterator with one shard actor per element of ``generators``.

    Each element is an iterable or a zero-argument callable returning one.
    """
    if not generators:
        raise IteratorUsageError("from_iterators() needs at least one iterable or callable")
    for g in generators:
        if inspect.isgenerator(g):
            raise IteratorUsageError(
                f"from_iterators() got the generator {g!r}, which cannot be sent to a shard actor; "
                "pass the generator function itself or a zero-argument lambda returning the generator"
            )
        _check_item_source(g, repeat)
    actors = [_remote_shard_actor().remote(g, repeat) for g in generators]
    return from_actors(actors, name=name or f"from_iterators[shards={len(actors)}]")


def from_actors(
    actors: Sequence[Any],
    name: str | None = None,
    on_shard_failure: FailureHook | None = None,
    shard_timeout_s: float | None = None,
    supervisor: ShardSupervisor | None = None,
) -> ParallelIterator[Any]:
    """A parallel iterator over existing actors whose class inherits :class:`ParallelIteratorWorker`.

    Without ``on_shard_failure`` a dead actor makes the gather raise
    :class:`~flowrl.errors.ShardFailedError` (and an exception raised in a shard reaches the
    driver as Ray's ``RayTaskError``). With it, a shard that dies, raises or times out is
    handed to ``on_shard_failure(shard_index, failed_actor, error)`` (``error.reason`` says
    which), which may return a replacement actor, on which the gather reopens its stream and
    carries on, or None to go on without that shard; raising propagates. ``shard_timeout_s``:
    the longest a shard may take to answer a request before it counts as failed (None: no limit).
    With a ``supervisor`` (see :class:`~flowrl.iterators.shards.ShardSupervisor`), a request past
    ``shard_timeout_s`` fails only once the supervisor says its actor is hung, and a replacement that
    is still starting is left out of the gather (which goes on with the other shards) until it has started.
    """
    if not actors:
        raise IteratorUsageError("from_actors() needs at least one actor")
    for actor in actors:
        if not hasattr(actor, "par_iter_next"):
            raise IteratorUsageError(
                f"from_actors(): {actor!r} cannot serve a shard; its class must inherit ParallelIteratorWorker"
            )
    if shard_timeout_s is not None and shard_timeout_s <= 0:
        raise IteratorUsageError(f"from_actors(shard_timeout_s={shard_timeout_s}): must be > 0 seconds, or None")
    return ParallelIterator(
        [_ActorSet(list(actors), [], on_shard_failure, shard_timeout_s, supervisor)],
        name or f"from_actors[shards={len(actors)}]",
    )
