"""ParallelIterator constructors, shard transforms, gathers, ordering and faults over Ray actors."""

from __future__ import annotations

import itertools
import os
import time
from typing import Any, Iterator

import pytest
import ray

from flowrl.errors import FlowRLError, IteratorUsageError, ShardFailedError
from flowrl.iterators import (
    FromActor,
    LocalIterator,
    NextValueNotReady,
    ParallelIterator,
    ParallelIteratorWorker,
    from_actors,
    from_items,
    from_iterators,
    from_range,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_session")]


@ray.remote(num_cpus=0)
class Versioned(ParallelIteratorWorker):
    """A shard whose items are its current version, which the driver bumps."""

    def __init__(self) -> None:
        self.version = 0
        super().__init__(self._items)

    def _items(self) -> Iterator[int]:
        while True:
            yield self.version

    def set_version(self, version: int) -> None:
        self.version = version

    def open_streams(self) -> int:
        return len(self._par_iters)


@ray.remote(num_cpus=0)
class Finite(ParallelIteratorWorker):
    """A shard over a fixed list that reports how many streams it holds open."""

    def open_streams(self) -> int:
        return len(self._par_iters)


def slow_source(delay_s: float, tag: str) -> Any:
    def gen() -> Iterator[str]:
        for i in itertools.count():
            time.sleep(delay_s)
            yield f"{tag}{i}"

    return gen


def dies_after(n: int) -> Any:
    def gen() -> Iterator[int]:
        for i in itertools.count():
            if i == n:
                os._exit(1)
            yield i

    return gen


# -- constructors ----------------------------------------------------------------------


def test_from_range_splits_into_contiguous_shards() -> None:
    it = from_range(10, num_shards=3)
    assert it.num_shards() == 3
    assert [s.take(10) for s in it.shards()] == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]


def test_from_items_deals_round_robin() -> None:
    it = from_items(["a", "b", "c", "d", "e"], num_shards=2)
    assert it.get_shard(0).take(5) == ["a", "c", "e"]
    assert it.get_shard(1).take(5) == ["b", "d"]


def test_from_iterators_takes_iterables_and_callables() -> None:
    it = from_iterators([[1, 2], lambda: (x * 10 for x in range(3))])
    assert sorted(it.gather_async().take(10)) == [0, 1, 2, 10, 20]


def test_from_iterators_rejects_generators_and_one_shot_repeats() -> None:
    with pytest.raises(IteratorUsageError, match="cannot be sent"):
        from_iterators([(x for x in range(3))])
    with pytest.raises(IteratorUsageError, match="neither an iterable"):
        from_iterators([42])
    with pytest.raises(IteratorUsageError):
        from_iterators([])
    with pytest.raises(IteratorUsageError, match="num_shards=0"):
        from_range(4, num_shards=0)


def test_repeat_restarts_each_shard() -> None:
    assert from_range(3, num_shards=1, repeat=True).gather_sync().take(7) == [0, 1, 2, 0, 1, 2, 0]


def test_from_actors_serves_a_custom_actor() -> None:
    actors = [Versioned.remote() for _ in range(2)]
    it = from_actors(actors)
    assert it.num_shards() == 2
    assert it.gather_sync().take(4) == [0, 0, 0, 0]


def test_from_actors_rejects_an_actor_that_is_not_a_worker() -> None:
    @ray.remote(num_cpus=0)
    class Plain:
        pass

    with pytest.raises(IteratorUsageError, match="must inherit ParallelIteratorWorker"):
        from_actors([Plain.remote()])


# -- transforms inside the shards ------------------------------------------------------


def test_parallel_transforms_run_inside_the_shard_actors() -> None:
    pids = from_range(4, num_shards=2).for_each(lambda x: os.getpid()).gather_sync().take(4)
    assert os.getpid() not in pids
    assert len(set(pids)) == 2


def test_every_parallel_combinator() -> None:
    base = from_range(8, num_shards=2)  # shards [0..3], [4..7]
    assert base.filter(lambda x: x % 2 == 0).gather_sync().take(10) == [0, 4, 2, 6]
    assert base.batch(2).gather_sync().take(10) == [[0, 1], [4, 5], [2, 3], [6, 7]]
    assert base.batch(2).flatten().gather_sync().take(3) == [0, 4, 1]
    assert base.combine(lambda x: [x, -x]).gather_sync().take(4) == [0, 4, 0, -4]
    assert base.transform(lambda it: (x + 100 for x in it)).gather_sync().take(2) == [100, 104]
    shuffled = base.shuffle(4, seed=0).gather_sync().take(10)
    assert sorted(shuffled) == list(range(8))


def test_repr_shows_the_chain() -> None:
    it = from_range(4, num_shards=2).for_each(str).filter(bool)
    assert repr(it) == "ParallelIterator[from_range[4, shards=2].for_each().filter()]"
    assert repr(it.gather_sync().for_each(int)) == (
        "LocalIterator[from_range[4, shards=2].for_each().filter().gather_sync().for_each()]"
    )


# -- gathers ---------------------------------------------------------------------------


def test_gather_sync_is_round_robin_and_drops_exhausted_shards() -> None:
    it = from_items([1, 2, 3, 4, 5], num_shards=2)
    assert list(it.gather_sync()) == [1, 2, 3, 4, 5]


def test_batch_across_shards_yields_one_list_per_round() -> None:
    assert list(from_items([1, 2, 3], num_shards=2).batch_across_shards()) == [[1, 2], [3]]


@pytest.mark.parametrize("num_async", [1, 3])
def test_gather_async_yields_every_item_once_and_each_shard_in_order(num_async: int) -> None:
    items = list(from_range(50, num_shards=2).gather_async(num_async=num_async))
    assert sorted(items) == list(range(50))
    first_shard = [x for x in items if x < 25]
    second_shard = [x for x in items if x >= 25]
    assert first_shard == sorted(first_shard) and second_shard == sorted(second_shard)


def test_gather_async_rejects_bad_num_async() -> None:
    with pytest.raises(IteratorUsageError, match="num_async=0"):
        from_range(4).gather_async(num_async=0)


def test_two_gathers_over_the_same_actors_do_not_share_items() -> None:
    it = from_range(6, num_shards=2)
    g1, g2 = it.gather_sync(), it.gather_sync()
    out1, out2 = [], []
    for _ in range(6):
        out1.append(next(g1))
        out2.append(next(g2))
    assert out1 == out2 == [0, 3, 1, 4, 2, 5]


def test_select_shards_and_parallel_union() -> None:
    it = from_range(9, num_shards=3)
    assert list(it.select_shards([2, 0]).gather_sync()) == [6, 0, 7, 1, 8, 2]
    both = from_range(2, num_shards=1).union(from_items(["a"], num_shards=1))
    assert both.num_shards() == 2
    assert list(both.gather_sync()) == [0, "a", 1]
    with pytest.raises(IteratorUsageError):
        it.select_shards([3])
    with pytest.raises(IteratorUsageError):
        it.get_shard(-1)


@pytest.mark.parametrize("gather", ["gather_sync", "gather_async"])
def test_zip_with_source_actor(gather: str) -> None:
    actors = [Versioned.remote() for _ in range(2)]
    for i, actor in enumerate(actors):
        ray.get(actor.set_version.remote(i))
    pairs = getattr(from_actors(actors), gather)().zip_with_source_actor().take(6)
    for pair in pairs:
        assert isinstance(pair, FromActor)
        assert pair.actor == actors[pair.item]
        actor, version = pair  # still a tuple: code that unpacks a pair keeps working
        assert (actor, version) == (pair.actor, pair.item)


@pytest.mark.parametrize("gather", ["gather_sync", "gather_async"])
def test_fetch_ordering(gather: str) -> None:
    """The driver's update after item i reaches the actor before item i+1 is produced."""
    actors = [Versioned.remote() for _ in range(2)]

    def bump(pair: tuple[Any, int]) -> tuple[Any, int]:
        actor, version = pair
        ray.get(actor.set_version.remote(version + 1))
        return pair

    it = getattr(from_actors(actors), gather)().zip_with_source_actor().for_each(bump)
    seen: dict[Any, list[int]] = {}
    for actor, version in it.take(20):
        seen.setdefault(actor, []).append(version)
    for versions in seen.values():
        assert versions == list(range(len(versions)))


def test_async_union_prefers_the_fast_source() -> None:
    fast = from_iterators([itertools.count]).gather_async()
    slow = from_iterators([slow_source(0.5, "s")]).gather_async()
    out = fast.union(slow).take(60)
    assert sum(isinstance(x, int) for x in out) >= 55


def test_gather_sync_inside_an_async_union_does_not_block_it() -> None:
    slow = from_iterators([slow_source(0.5, "s"), slow_source(0.5, "t")]).gather_sync()
    fast = from_range(1000, num_shards=1).gather_async()
    out = slow.union(fast).take(60)
    assert sum(isinstance(x, int) for x in out) >= 55


def test_async_union_waits_without_polling() -> None:
    markers = 0

    def count_markers(it: Iterator[Any]) -> Iterator[Any]:
        nonlocal markers
        for item in it:
            if isinstance(item, NextValueNotReady):
                markers += 1
            yield item

    a = from_iterators([slow_source(0.3, "a")]).gather_async().transform(count_markers)
    b = from_iterators([slow_source(0.3, "b")]).gather_async().transform(count_markers)
    assert len(a.union(b).take(4)) == 4
    # One not-ready check per source per wake-up; a 1 ms polling loop would count hundreds.
    assert markers <= 20


def test_deterministic_union_of_gathers_keeps_its_order() -> None:
    a = from_items(["a0", "a1"], num_shards=1).gather_async()
    b = from_iterators([slow_source(0.05, "b")]).gather_async()
    assert a.union(b, round_robin_weights=[1, 2]).take(6) == ["a0", "b0", "b1", "a1", "b2", "b3"]


def test_metrics_shared_by_a_union_of_gathers() -> None:
    def count(key: str) -> Any:
        def fn(x: Any) -> Any:
            LocalIterator.get_metrics().counters[key] += 1
            return x

        return fn

    a = from_range(4, num_shards=2).gather_async().for_each(count("a"))
    b = from_range(3, num_shards=1).gather_sync().for_each(count("b"))
    u = a.union(b)
    assert len(list(u)) == 7
    assert dict(u.shared_metrics.get().counters) == {"a": 4, "b": 3}


# -- serialization and misuse -----------------------------------------------------------


@ray.remote(num_cpus=0)
def consume(it: LocalIterator[Any]) -> list[Any]:
    return sorted(it)


def test_local_iterator_runs_inside_a_ray_task() -> None:
    gathered = from_range(6, num_shards=2).for_each(lambda x: x + 1).gather_async().for_each(lambda x: x * 10)
    assert ray.get(consume.remote(gathered)) == [10, 20, 30, 40, 50, 60]
    unioned = from_range(2, num_shards=1).gather_sync().union(from_items(["z"], num_shards=1).gather_sync())
    assert ray.get(consume.remote(unioned.for_each(str))) == ["0", "1", "z"]


def test_iterating_a_parallel_iterator_directly_raises() -> None:
    it = from_range(4)
    with pytest.raises(IteratorUsageError, match="cannot be iterated directly"):
        iter(it)
    with pytest.raises(IteratorUsageError, match="gather_sync"):
        for _ in it:
            pass
    assert isinstance(it, ParallelIterator)


# -- faults ----------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("gather", ["gather_sync", "gather_async"])
def test_a_shard_that_dies_mid_gather_raises_naming_the_shard(gather: str) -> None:
    it = getattr(from_iterators([itertools.count, dies_after(3)]), gather)()
    with pytest.raises(ShardFailedError, match="shard 1 of from_iterators") as info:
        while True:  # the healthy shard keeps serving until Ray reports the death
            next(it)
    assert info.value.shard_index == 1
    assert isinstance(info.value.__cause__, ray.exceptions.RayActorError)


@pytest.mark.timeout(60)
def test_a_shard_killed_while_the_gather_waits_on_it() -> None:
    actors = [Versioned.remote(), ray.remote(num_cpus=0)(ParallelIteratorWorker).remote(slow_source(30.0, "x"))]
    it = from_actors(actors).gather_async()
    assert next(it) == 0
    ray.kill(actors[1], no_restart=True)
    with pytest.raises(ShardFailedError, match="shard 1") as info:
        while True:
            next(it)
    assert info.value.shard_index == 1


@pytest.mark.timeout(60)
def test_failure_hook_replaces_a_dead_shard_and_the_gather_carries_on() -> None:
    actors = [Versioned.remote(), Versioned.remote()]
    calls: list[tuple[int, ShardFailedError]] = []

    def replace(index: int, dead: Any, error: ShardFailedError) -> Any:
        calls.append((index, error))
        fresh = Versioned.remote()
        ray.get(fresh.set_version.remote(100))
        return fresh

    it = from_actors(actors, on_shard_failure=replace).gather_async()
    assert it.take(4) == [0, 0, 0, 0]
    ray.kill(actors[1], no_restart=True)
    out: list[int] = []
    while 100 not in out:
        out.append(next(it))
    assert [index for index, _ in calls] == [1]
    assert calls[0][1].shard_index == 1
    assert out.count(100) >= 1 and set(out) <= {0, 100}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("gather", ["gather_sync", "gather_async"])
def test_failure_hook_can_drop_a_dead_shard(gather: str) -> None:
    shard_actor = ray.remote(num_cpus=0)(ParallelIteratorWorker)
    actors = [shard_actor.remote(lambda: range(300)), shard_actor.remote(dies_after(2))]
    par = from_actors(actors, on_shard_failure=lambda index, dead, error: None)
    items = list(getattr(par, gather)())
    assert sorted(items) == sorted(list(range(300)) + [0, 1])


class RefusesReplacements:
    """A shard supervisor that, asked about a failed shard's replacement, raises (as a worker set with too few
    workers left does)."""

    def check(self, actor: Any, since: float) -> float | None:
        return None

    def started(self, actor: Any) -> Any | None:
        raise FlowRLError("too few workers left")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("gather", ["gather_sync", "gather_async"])
def test_the_supervisors_error_about_a_replacement_not_made_yet_reaches_the_caller(gather: str) -> None:
    shard_actor = ray.remote(num_cpus=0)(ParallelIteratorWorker)
    actors = [shard_actor.remote(lambda: range(300)), shard_actor.remote(dies_after(2))]
    not_made_yet = object()  # what a failure hook returns for a replacement it makes later: no stream to close
    par = from_actors(
        actors, on_shard_failure=lambda index, dead, error: not_made_yet, supervisor=RefusesReplacements()
    )
    with pytest.raises(FlowRLError, match="too few workers left"):
        list(getattr(par, gather)())


def test_streams_are_closed_when_a_gather_ends() -> None:
    actor = Versioned.remote()
    it = from_actors([actor]).gather_sync()
    assert next(it) == 0
    assert ray.get(actor.open_streams.remote()) == 1
    del it  # an abandoned gather closes its generator, which releases the stream
    assert ray.get(actor.open_streams.remote()) == 0
    finite = Finite.remote([1, 2])
    assert list(from_actors([finite]).gather_async()) == [1, 2]
    assert ray.get(finite.open_streams.remote()) == 0  # an exhausted stream is released too


def test_bad_shard_arguments_fail_in_the_driver() -> None:
    with pytest.raises(IteratorUsageError, match="shuffle_buffer_size=0"):
        from_range(4).shuffle(0)


# -- faults a failure hook absorbs: errors, timeouts, stragglers ------------------------------


def raises_after(n: int) -> Any:
    def gen() -> Iterator[int]:
        for i in itertools.count():
            if i == n:
                raise ValueError(f"item {i} is broken")
            yield i

    return gen


def hangs_after(n: int) -> Any:
    def gen() -> Iterator[int]:
        for i in itertools.count():
            if i == n:
                time.sleep(3600)
            yield i

    return gen


shard_actor = ray.remote(num_cpus=0)(ParallelIteratorWorker)


class Replacer:
    """A failure hook that kills the failed actor, records the error and serves ``range(100, ...)`` instead."""

    def __init__(self) -> None:
        self.errors: list[ShardFailedError] = []

    def __call__(self, index: int, failed: Any, error: ShardFailedError) -> Any:
        self.errors.append(error)
        ray.kill(failed, no_restart=True)
        return shard_actor.remote(lambda: itertools.count(100))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("gather", ["gather_sync", "gather_async"])
def test_an_error_raised_in_a_shard_goes_to_the_failure_hook(gather: str) -> None:
    hook = Replacer()
    it = getattr(
        from_actors(
            [shard_actor.remote(lambda: itertools.count(1000)), shard_actor.remote(raises_after(2))],
            on_shard_failure=hook,
        ),
        gather,
    )()
    items: list[int] = []
    while 100 not in items:  # the healthy shard keeps serving meanwhile
        items.append(next(it))
    assert [e.reason for e in hook.errors] == ["raised"]
    assert hook.errors[0].shard_index == 1
    assert "item 2 is broken" in str(hook.errors[0].__cause__)
    assert {0, 1, 1000} <= set(items)


@pytest.mark.timeout(60)
def test_an_error_raised_in_a_shard_without_a_hook_is_the_original_error() -> None:
    it = from_actors([shard_actor.remote(raises_after(1))]).gather_sync()
    assert next(it) == 0
    with pytest.raises(ValueError, match="item 1 is broken"):
        next(it)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("gather", ["gather_sync", "gather_async"])
def test_a_hung_shard_times_out_and_is_replaced(gather: str) -> None:
    hook = Replacer()
    actors = [shard_actor.remote(lambda: itertools.count(1000)), shard_actor.remote(hangs_after(1))]
    it = getattr(from_actors(actors, on_shard_failure=hook, shard_timeout_s=2.0), gather)()
    items: list[int] = []
    while 100 not in items:  # the healthy shard keeps serving meanwhile
        items.append(next(it))
    assert [(e.reason, e.shard_index) for e in hook.errors] == [("timed_out", 1)]
    assert 0 in items and 1000 in items


@pytest.mark.timeout(60)
def test_a_hung_shard_without_a_hook_raises_within_its_timeout() -> None:
    it = from_actors([shard_actor.remote(hangs_after(0))], shard_timeout_s=0.5).gather_async()
    started = time.monotonic()
    with pytest.raises(ShardFailedError, match="gave no item within 0.5 s") as info:
        next(it)
    assert info.value.reason == "timed_out"
    assert time.monotonic() - started < 30


@ray.remote(num_cpus=0)
class Counting(ParallelIteratorWorker):
    """Items 0, 1, 2 ...; ``served()`` says how many it has produced."""

    def __init__(self) -> None:
        self.count = 0
        super().__init__(self._items)

    def _items(self) -> Iterator[int]:
        for i in itertools.count():
            self.count += 1
            yield i

    def served(self) -> int:
        return self.count


@pytest.mark.timeout(60)
def test_a_replaced_shard_gets_its_full_num_async_requests_back() -> None:
    replacements: list[Any] = []

    def hook(index: int, failed: Any, error: ShardFailedError) -> Any:
        replacements.append(Counting.remote())
        return replacements[-1]

    def one_then_exit() -> Iterator[str]:
        yield "first"
        os._exit(1)

    it = from_actors([shard_actor.remote(one_then_exit)], on_shard_failure=hook).gather_async(num_async=3)
    item = next(it)  # "first", unless its answer was lost with the dying process
    while isinstance(item, str):
        item = next(it)
    assert item == 0  # the replacement's first item
    # Three requests went to the replacement at once (the next goes out when the gather is resumed).
    deadline = time.monotonic() + 10
    while ray.get(replacements[0].served.remote()) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    assert ray.get(replacements[0].served.remote()) == 3
    assert it.take(3) == [1, 2, 3]
    assert len(replacements) == 1


@pytest.mark.timeout(60)
def test_batch_across_shards_with_min_fraction_does_not_wait_for_a_straggler() -> None:
    fast = [shard_actor.remote(slow_source(0.01, t)) for t in "ab"]
    straggler = shard_actor.remote(slow_source(5.0, "z"))  # far slower than five fast rounds
    it = from_actors([*fast, straggler]).batch_across_shards(min_fraction=0.6)
    rounds = [next(it) for _ in range(5)]
    assert [sorted(item[0] for item in r) for r in rounds] == [["a", "b"]] * 5
    assert it.shared_metrics.get().counters["num_late_items"] == 0
    while not any(item.startswith("z") for item in rounds[-1]):  # the late fragment joins a later round
        rounds.append(next(it))
    assert [item for r in rounds for item in r if item.startswith("z")] == ["z0"]
    assert it.shared_metrics.get().counters["num_late_items"] == 1


def test_batch_across_shards_rejects_a_bad_min_fraction() -> None:
    with pytest.raises(IteratorUsageError, match="min_fraction=0"):
        from_range(4).batch_across_shards(min_fraction=0)
