"""The shard side of parallel iterators: the actors that serve shards, and one gather's streams on them.

Any Ray actor can serve shards by inheriting :class:`ParallelIteratorWorker`: each gather opens its
own stream on it (keyed by a fresh id) with the shard's transforms, and pulls that stream's items.
In the driver, :class:`_ShardStreams` holds one gather's streams on its shards: opening, requesting,
failures (a replacement actor through the failure hook, or a dropped shard) and closing.
:class:`~flowrl.iterators.ParallelIterator` builds on both.
"""

from __future__ import annotations

import functools
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Protocol, Sequence

from flowrl.deferred import ray
from flowrl.errors import IteratorUsageError, ShardFailedError
from flowrl.iterators.local import LocalIterator
from flowrl.iterators.metrics import SharedMetrics

ShardTransform = Callable[[LocalIterator[Any]], LocalIterator[Any]]
ItemSource = Iterable[Any] | Callable[[], Iterable[Any]]


class _EndOfShard:
    """The value a shard returns once its stream is exhausted (one instance per process)."""

    _instance: "_EndOfShard | None" = None

    def __new__(cls) -> "_EndOfShard":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return (_EndOfShard, ())

    def __repr__(self) -> str:
        return "END_OF_SHARD"


_END = _EndOfShard()


def _check_item_source(source: Any, repeat: bool) -> None:
    """Reject what a shard could not serve: non-iterables, and one-shot iterators to repeat."""
    if callable(source):
        return
    if not isinstance(source, Iterable):
        raise IteratorUsageError(
            f"item source {source!r} is neither an iterable nor a zero-argument callable returning one"
        )
    if repeat and iter(source) is source:
        raise IteratorUsageError(
            f"repeat=True needs a source that can be restarted, but {source!r} is a one-shot iterator; "
            "pass a list or a zero-argument callable that returns a fresh iterable"
        )


_FAST_SLOTS = 4


def _unwrapped(item: Any) -> Any:
    return item


class _TimedHandOff:
    """A returned item on its way out of a shard actor: pickles as the item itself, and tells the actor,
    when Ray drops it (serialized and stored), how long that took."""

    __slots__ = ("item", "worker", "returned")

    def __init__(self, item: Any, worker: "ParallelIteratorWorker") -> None:
        self.item = item
        self.worker = worker
        self.returned = time.perf_counter()

    def __reduce__(self) -> tuple[Callable[[Any], Any], tuple[Any]]:
        return _unwrapped, (self.item,)

    def __del__(self) -> None:
        self.worker._handed_off(time.perf_counter() - self.returned)


class HandOffSpan(NamedTuple):
    """One item a shard actor returned, from the moment its method returned it until Ray let go of it
    (serialized and stored: in the reply, or in the object store), on the wall clock (``time.time_ns()``),
    and the native thread that did it."""

    start_ns: int
    duration_ns: int
    thread_id: int


class ParallelIteratorWorker:
    """Mixin that lets a Ray actor serve shards of parallel iterators.

    ``item_generator`` is an iterable, or a zero-argument callable returning one (use a
    callable for generators: they cannot be pickled or restarted). With ``repeat=True``
    the items are served again from the start each time they run out.

    Each gather opens its own stream on the actor, keyed by a unique id. The first
    streams also get a numbered slot with a zero-argument method
    (``par_iter_next_<slot>``): Ray charges tens of microseconds per call argument,
    which is a sizeable share of a small item's round trip. Slots are never reused, so a
    late request can never reach another gather's stream.

    With :attr:`time_handoffs` on, the actor also times how long Ray takes to hand each
    returned item over (serialize it and store it, in the reply or the object store): the item
    goes out in a small wrapper that only Ray holds, which unpickles as the item itself and
    counts the seconds from the return until Ray drops it.
    """

    def __init__(self, item_generator: ItemSource, repeat: bool = False) -> None:
        _check_item_source(item_generator, repeat)
        self._item_generator = item_generator
        self._repeat = repeat
        self._par_iters: dict[str, Iterator[Any]] = {}
        self._par_iters_closed: set[str] = set()
        self._par_iter_slots: list[str] = []
        #: Whether to time the hand-off of returned items (:attr:`handoff_s`, :attr:`handoffs`).
        self.time_handoffs = False
        #: Seconds Ray took to serialize and store the returned items that were timed, and how many.
        self.handoff_s = 0.0
        self.handoffs = 0
        #: While a list: a :class:`HandOffSpan` per timed item (whoever traces the actor sets and drains it).
        self.handoff_spans: list[HandOffSpan] | None = None

    def _items(self) -> Iterator[Any]:
        while True:
            source = self._item_generator() if callable(self._item_generator) else self._item_generator
            produced = False
            for item in source:
                produced = True
                yield item
            if not (self._repeat and produced):
                return

    def par_iter_init(self, key: str, transforms: Sequence[ShardTransform]) -> int | None:
        """Open stream ``key`` with the shard's transforms; return its slot, if one is left."""
        it: LocalIterator[Any] = LocalIterator(lambda timeout: self._items(), SharedMetrics(), name="shard")
        for transform in transforms:
            it = transform(it)
        self._par_iters[key] = it
        if len(self._par_iter_slots) < _FAST_SLOTS:
            self._par_iter_slots.append(key)
            return len(self._par_iter_slots) - 1
        return None

    def par_iter_next(self, key: str) -> Any:
        """The next item of stream ``key``, or the end-of-shard marker once it is exhausted."""
        it = self._par_iters.get(key)
        if it is None:
            if key in self._par_iters_closed:
                return _END  # a request that was in flight when the stream ended
            raise IteratorUsageError(f"stream {key} was never opened on this actor")
        try:
            item = next(it)
        except StopIteration:
            self.par_iter_close(key)
            return _END
        return _TimedHandOff(item, self) if self.time_handoffs else item

    def _handed_off(self, seconds: float) -> None:
        """Count an item Ray finished handing over, ``seconds`` after it was returned."""
        self.handoff_s += seconds
        self.handoffs += 1
        spans = self.handoff_spans  # read once: a trace may end (set it to None) in another thread
        if spans is not None:
            duration_ns = int(seconds * 1e9)
            spans.append(HandOffSpan(time.time_ns() - duration_ns, duration_ns, threading.get_native_id()))

    def par_iter_close(self, key: str) -> None:
        """Drop stream ``key``; later requests for it get the end-of-shard marker."""
        self._par_iters.pop(key, None)
        self._par_iters_closed.add(key)

    def par_iter_next_0(self) -> Any:
        """``par_iter_next`` for the stream in slot 0."""
        return self.par_iter_next(self._par_iter_slots[0])

    def par_iter_next_1(self) -> Any:
        """``par_iter_next`` for the stream in slot 1."""
        return self.par_iter_next(self._par_iter_slots[1])

    def par_iter_next_2(self) -> Any:
        """``par_iter_next`` for the stream in slot 2."""
        return self.par_iter_next(self._par_iter_slots[2])

    def par_iter_next_3(self) -> Any:
        """``par_iter_next`` for the stream in slot 3."""
        return self.par_iter_next(self._par_iter_slots[3])


class _ShardActor(ParallelIteratorWorker):
    """The actor behind ``from_items``, ``from_range`` and ``from_iterators``."""


@functools.cache
def _remote_shard_actor() -> Any:
    """``_ShardActor`` as a Ray actor class (made on first use: importing this module imports no Ray)."""
    return ray.remote(num_cpus=0)(_ShardActor)


FailureHook = Callable[[int, Any, ShardFailedError], Any]
"""``hook(shard_index, failed_actor, error)`` returns a replacement actor, or None to drop the shard."""


class ShardSupervisor(Protocol):
    """What a gather asks, besides its failure hook, of whoever keeps its shards' actors (never blocking)."""

    def check(self, actor: Any, since: float) -> float | None:
        """For a request to ``actor`` pending (since ``since``, monotonic seconds) past the shard's timeout:
        seconds until it may be checked again (it is making progress), or None if it is hung (the gather
        then fails it)."""
        ...

    def started(self, actor: Any) -> Any | None:
        """The actor now serving in ``actor``'s place once it has started (``actor`` itself, or what replaced
        it in turn), or None while it is still starting: the gather leaves its shard out until then. ``actor``
        may be a stand-in that the failure hook returned for a replacement it makes later."""
        ...


#: Least time a shard actor gets to open a stream, whatever the gather's ``shard_timeout_s`` (which
#: bounds items): a replacement actor may still be starting (importing, building envs).
OPEN_TIMEOUT_S = 120.0


@functools.cache
def _shard_failures() -> tuple[type[BaseException], ...]:
    """What a failed or timed-out shard call raises (looked up on first use: importing this module imports no Ray)."""
    return (ray.exceptions.RayActorError, ray.exceptions.RayTaskError, ray.exceptions.GetTimeoutError)


@dataclass
class _ActorSet:
    """Shard actors that share one list of transforms, one failure hook and one item timeout."""

    actors: list[Any]
    transforms: list[ShardTransform] = field(default_factory=list)
    on_failure: FailureHook | None = None
    timeout_s: float | None = None
    supervisor: ShardSupervisor | None = None

    def with_transform(self, transform: ShardTransform) -> "_ActorSet":
        return _ActorSet(self.actors, self.transforms + [transform], self.on_failure, self.timeout_s, self.supervisor)

    def shard(self, index: int, actor: Any) -> "_Shard":
        """Shard ``index`` of a gather, served by ``actor`` (one of this set's)."""
        return _Shard(index, actor, self.transforms, self.on_failure, self.timeout_s, self.supervisor)


@dataclass(eq=False)
class _Shard:
    """One shard as seen by one gather; the actor changes if the failure hook replaces it."""

    index: int
    actor: Any
    transforms: list[ShardTransform]
    on_failure: FailureHook | None
    timeout_s: float | None = None
    supervisor: ShardSupervisor | None = None
    dropped: bool = False
    next_item: Callable[[], ray.ObjectRef[Any]] | None = None
    #: When the request in flight (the oldest, with several) is next checked: its timeout, or a later
    #: check the supervisor asked for. None: no limit.
    deadline: float | None = None
    #: When the actor began that request.
    since: float = 0.0

    def requested(self, now: float) -> None:
        """The shard's actor began a request at ``now``: its timeout runs from then."""
        self.since = now
        self.deadline = None if self.timeout_s is None else now + self.timeout_s


class _ShardStreams:
    """One gather's streams on its shards: opening, requesting, fetching, failures, closing.

    A shard fails when its actor dies, when code in it raises (only with a failure hook;
    without one the task error propagates as Ray raised it) or when a request is pending
    longer than its ``timeout_s`` (and, with a supervisor, its :meth:`ShardSupervisor.check` says it is
    hung). The failure hook then replaces the actor (the stream is reopened on it) or drops the
    shard; without a hook a :class:`ShardFailedError` is raised. A replacement its supervisor says is
    still starting is ``parked``: left out until :meth:`rejoined` finds it started.
    """

    def __init__(self, shards: list[_Shard], iterator_name: str) -> None:
        self.iterator_name = iterator_name
        self.key = uuid.uuid4().hex
        self.parked: list[_Shard] = []
        opening = [(shard, shard.actor.par_iter_init.remote(self.key, shard.transforms)) for shard in shards]
        self.live = [shard for shard, ref in opening if self._finish_open(shard, ref)]

    def _open(self, shard: _Shard) -> bool:
        """Open this stream on the shard's (replacement) actor; False if it is still starting (parked) or dropped."""
        if shard.supervisor is not None:
            started = shard.supervisor.started(shard.actor)
            if started is None:
                self.parked.append(shard)
                return False
            shard.actor = started
        return self._finish_open(shard, shard.actor.par_iter_init.remote(self.key, shard.transforms))

    def _finish_open(self, shard: _Shard, ref: ray.ObjectRef[Any]) -> bool:
        """Wait for a stream to open (re-opening on a replacement actor); False if dropped or parked."""
        try:
            slot = ray.get(ref, timeout=max(shard.timeout_s or 0.0, OPEN_TIMEOUT_S))
        except _shard_failures() as e:
            return self.fail(shard, e) and self._open(shard)
        if slot is None:
            shard.next_item = functools.partial(shard.actor.par_iter_next.remote, self.key)
        else:
            shard.next_item = getattr(shard.actor, f"par_iter_next_{slot}").remote
        return True

    def fail(self, shard: _Shard, cause: BaseException) -> bool:
        """Hand a failed shard to its hook: True if its actor was replaced, False if it was dropped."""
        if isinstance(cause, ray.exceptions.RayTaskError):
            if shard.on_failure is None:
                raise cause
            reason, what = "raised", f"raised {type(cause).__name__}"
        elif isinstance(cause, ray.exceptions.GetTimeoutError):
            reason, what = "timed_out", f"gave no item within {shard.timeout_s} s"
        else:
            reason, what = "died", f"died or became unreachable ({type(cause).__name__})"
        error = ShardFailedError(
            f"shard {shard.index} of {self.iterator_name} failed: its actor {shard.actor} {what} while serving items",
            shard_index=shard.index,
            iterator_name=self.iterator_name,
            reason=reason,
        )
        error.__cause__ = cause
        if shard.on_failure is None:
            raise error
        shard.next_item = None  # the stream is open on no actor until it is reopened on the replacement
        replacement = shard.on_failure(shard.index, shard.actor, error)
        if replacement is None:
            shard.dropped = True
            return False
        shard.actor = replacement
        return True

    def restart(self, shard: _Shard, cause: BaseException) -> bool:
        """Fail ``shard`` and reopen this stream on its replacement; False if it was dropped or parked."""
        return self.fail(shard, cause) and self._open(shard)

    def rejoined(self) -> list[_Shard]:
        """The parked shards whose actors have started, with this stream open on them again (never waits
        for one still starting)."""
        parked, self.parked = self.parked, []
        back = [shard for shard in parked if self._open(shard)]
        self.live += [shard for shard in back if shard not in self.live]
        return back

    def request(self, shard: _Shard) -> ray.ObjectRef[Any]:
        """Ask ``shard`` for the next item of this stream."""
        assert shard.next_item is not None
        return shard.next_item()

    def close(self) -> None:
        """Release this stream on every live shard that has it open (fire and forget): not on a failed shard's
        replacement it was not reopened on yet, which may not even exist yet (parked)."""
        if not ray.is_initialized():
            return
        for shard in self.live:
            if not shard.dropped and shard.next_item is not None:
                shard.actor.par_iter_close.remote(self.key)


#: Seconds between two looks, while a gather has parked shards, at whether their actors have started.
PARKED_POLL_S = 1.0


def next_deadline(shards: Iterable[_Shard], streams: _ShardStreams, timeout: float | None) -> float | None:
    """How long a wait may block: until the nearest shard deadline, the next look at the parked shards, or
    the caller's timeout."""
    deadlines = [s.deadline for s in shards if s.deadline is not None]
    nearest = min(deadlines, default=None)
    left = None if nearest is None else max(0.0, nearest - time.monotonic())
    if streams.parked:
        left = PARKED_POLL_S if left is None else min(left, PARKED_POLL_S)
    if left is None:
        return timeout
    return left if timeout is None else min(left, timeout)


def overdue(requests: dict[_Shard, ray.ObjectRef[Any]]) -> list[_Shard]:
    """The shards whose request is still not answered past their deadline, and (if they have a supervisor)
    that it says are hung; the deadlines of those it says are progressing move to their next check."""
    now = time.monotonic()
    late = {s: ref for s, ref in requests.items() if s.deadline is not None and now >= s.deadline}
    if not late:
        return []
    answered, _ = ray.wait(list(late.values()), num_returns=len(late), timeout=0)
    expired = []
    for shard, ref in late.items():
        if ref in answered:
            continue
        recheck = None if shard.supervisor is None else shard.supervisor.check(shard.actor, shard.since)
        if recheck is None:
            expired.append(shard)
        else:
            shard.deadline = now + recheck
    return expired


def wait_parked() -> None:
    """With every shard of a blocking gather parked: wait until the next look at them (bounded, no spinning;
    a gather with a timeout yields a not-ready marker instead)."""
    time.sleep(PARKED_POLL_S)


def timed_out(shard: _Shard) -> ray.exceptions.GetTimeoutError:
    return ray.exceptions.GetTimeoutError(f"no item from {shard.actor} within {shard.timeout_s} s")
