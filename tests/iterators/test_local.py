"""LocalIterator combinators, metrics, duplicate and union over in-process sources (no Ray)."""

from __future__ import annotations

import pickle
import threading
from typing import Any, Iterator, cast

import pytest

from flowrl.errors import IteratorUsageError
from flowrl.iterators import LocalIterator, MetricsContext, NextValueNotReady, SharedMetrics

pytestmark = pytest.mark.unit


def local(items: list[Any], name: str = "items") -> LocalIterator[Any]:
    return LocalIterator(lambda timeout: iter(items), name=name)


def counting(pulled: list[int], n: int = 1000) -> LocalIterator[int]:
    """A source over range(n) that records every item pulled from it."""

    def base(timeout: float | None) -> Iterator[int]:
        for i in range(n):
            pulled.append(i)
            yield i

    return LocalIterator(base, name="counting")


def scripted(script: list[Any]) -> LocalIterator[Any]:
    """A non-blocking source: a marker in the script stands for 'nothing ready yet'."""
    return LocalIterator(lambda timeout: iter(script), name="scripted")


def not_ready() -> NextValueNotReady:
    event = threading.Event()
    event.set()  # anything waiting on it returns at once
    return NextValueNotReady(events=[event])


def test_for_each_filter_take() -> None:
    it = local(list(range(10))).for_each(lambda x: x * 10).filter(lambda x: x % 20 == 0)
    assert it.take(3) == [0, 20, 40]
    assert it.take(10) == [60, 80]  # take stops where the iterator ends


def test_batch_keeps_a_short_last_batch() -> None:
    assert list(local(list(range(7))).batch(3)) == [[0, 1, 2], [3, 4, 5], [6]]


def test_flatten_and_combine() -> None:
    assert list(local([[1, 2], [], [3]]).flatten()) == [1, 2, 3]
    assert list(local([1, 2, 3]).combine(lambda x: [x] * x)) == [1, 2, 2, 3, 3, 3]


def test_transform_sees_the_whole_stream() -> None:
    def running_sum(it: Iterator[int]) -> Iterator[int]:
        total = 0
        for x in it:
            total += x
            yield total

    assert list(local([1, 2, 3, 4]).transform(running_sum)) == [1, 3, 6, 10]


def test_shuffle_is_a_seeded_permutation() -> None:
    items = list(range(50))
    first = list(local(items).shuffle(10, seed=1))
    assert sorted(first) == items
    assert first != items
    assert list(local(items).shuffle(10, seed=1)) == first


def test_show_prints_items(capsys: pytest.CaptureFixture[str]) -> None:
    local(["a", "b", "c"]).show(2)
    assert capsys.readouterr().out == "a\nb\n"


def test_transforms_run_lazily() -> None:
    pulled: list[int] = []
    it = counting(pulled).for_each(lambda x: x + 1)
    assert pulled == []
    assert next(it) == 1
    assert pulled == [0]


def test_repr_shows_the_chain() -> None:
    it = local([1], name="src").for_each(str).filter(bool).batch(2)
    assert repr(it) == "LocalIterator[src.for_each().filter().batch(2)]"


def test_markers_pass_through_every_combinator() -> None:
    marker = NextValueNotReady()
    it = scripted([[1], marker, [2, 3]]).for_each(lambda x: x).filter(lambda x: True).flatten()
    assert list(it) == [1, marker, 2, 3]
    batched = list(scripted([1, marker, 2]).batch(2))
    assert batched == [marker, [1, 2]]


def test_get_metrics_inside_a_transform() -> None:
    def count(x: int) -> int:
        LocalIterator.get_metrics().counters["seen"] += 1
        return x

    it = local([1, 2, 3]).for_each(count)
    assert list(it) == [1, 2, 3]
    assert it.shared_metrics.get().counters["seen"] == 3


def test_get_metrics_outside_an_iterator_raises() -> None:
    with pytest.raises(IteratorUsageError, match="outside a running iterator"):
        LocalIterator.get_metrics()
    it = local([1])
    next(it)
    with pytest.raises(IteratorUsageError):
        LocalIterator.get_metrics()  # the context is uninstalled after each item


def test_extending_a_started_iterator_raises() -> None:
    it = local([1, 2])
    next(it)
    with pytest.raises(IteratorUsageError, match="already produced items"):
        it.for_each(str)


def test_pickle_round_trip_of_a_definition() -> None:
    it = local([1, 2, 3]).for_each(lambda x: x * 2)  # cloudpickle is what Ray uses
    import cloudpickle

    copy = cloudpickle.loads(cloudpickle.dumps(it))
    assert list(copy) == [2, 4, 6]
    next(it)
    with pytest.raises(IteratorUsageError, match="cannot be sent"):
        pickle.dumps(it)


def test_metrics_context_save_and_restore() -> None:
    metrics = MetricsContext()
    metrics.counters["steps"] = 5
    metrics.info["note"] = "x"
    with metrics.timers["learn"] as timer:
        timer.push_units_processed(10)
    saved = metrics.save()
    other = MetricsContext()
    other.restore(saved)
    assert other.counters["steps"] == 5 and other.info == {"note": "x"}
    assert metrics.timers["learn"].count == 1 and metrics.timers["learn"].mean_throughput > 0


# -- duplicate -------------------------------------------------------------------------


def test_duplicate_children_see_every_item_when_pulled_alone() -> None:
    a, b = local(list(range(5))).duplicate(2)
    assert a.take(5) == [0, 1, 2, 3, 4]
    assert b.take(5) == [0, 1, 2, 3, 4]


def test_duplicate_raises_instead_of_buffering_without_bound() -> None:
    a, _ = local(list(range(100))).duplicate(2, max_buffer=3)
    with pytest.raises(IteratorUsageError, match="ahead of a sibling"):
        a.take(10)
    b, _ = local(list(range(3))).duplicate(2, max_buffer=3)
    assert b.take(10) == [0, 1, 2]  # the source ended before a fourth item was buffered


def test_union_missing_a_duplicate_sibling_raises_instead_of_hanging() -> None:
    first, _forgotten = local(list(range(10))).duplicate(2)
    with pytest.raises(IteratorUsageError, match="deadlock"):
        first.union(local(["a", "b"])).take(20)


def test_duplicate_children_whose_progress_no_union_sees_are_no_deadlock() -> None:
    # Each branch takes items without yielding (a batch filling up, items a filter drops), as
    # ppo_dqn's PPO and replay branches do: the union sees only sibling waits, yet both move.
    batched, filtered = local(list(range(40))).duplicate(2)
    merged = batched.batch(4).union(filtered.filter(lambda x: x % 10 == 9))
    out = merged.take(100)
    assert sorted(item for item in out if isinstance(item, int)) == [9, 19, 29, 39]
    assert [item for item in out if isinstance(item, list)] == [list(range(i, i + 4)) for i in range(0, 40, 4)]


def test_duplicate_back_pressure_inside_a_union() -> None:
    pulled: list[int] = []
    consumed = {"a": 0, "b": 0}
    leads: list[int] = []

    def seen(name: str) -> Any:
        def fn(x: int) -> int:
            consumed[name] += 1
            leads.append(abs(consumed["a"] - consumed["b"]))
            return x

        return fn

    a, b = counting(pulled).duplicate(2)
    fast = a.for_each(seen("a")).batch(3)  # wants three items per output
    slow = b.for_each(seen("b"))
    out = fast.union(slow).take(40)
    assert len(out) == 40
    assert max(leads) <= 1  # lockstep: neither branch ever gets two items ahead
    assert len(pulled) <= max(consumed.values())  # nothing buffered beyond what was consumed


# -- union -----------------------------------------------------------------------------


def test_union_shares_one_metrics_context() -> None:
    def bump(key: str) -> Any:
        def fn(x: Any) -> Any:
            LocalIterator.get_metrics().counters[key] += 1
            return x

        return fn

    a = local([1, 2]).for_each(bump("a"))
    b = local([3]).for_each(bump("b"))
    c = local([4, 5, 6]).for_each(bump("c"))
    inner = a.union(b)
    outer = c.union(inner)  # nesting re-points the inner union's children too
    assert sorted(outer) == [1, 2, 3, 4, 5, 6]
    metrics = outer.shared_metrics.get()
    assert dict(metrics.counters) == {"a": 2, "b": 1, "c": 3}
    for it in (a, b, c, inner):
        assert it.shared_metrics.get() is metrics


def test_deterministic_union_with_weights() -> None:
    a = local(["a0", "a1", "a2"])
    b = local(["b0", "b1", "b2", "b3", "b4", "b5"])
    out = list(a.union(b, round_robin_weights=[1, 2]))
    assert out == ["a0", "b0", "b1", "a1", "b2", "b3", "a2", "b4", "b5"]


def test_deterministic_union_default_weights_alternate() -> None:
    out = list(local([1, 2, 3]).union(local(["x"]), deterministic=True))
    assert out == [1, "x", 2, 3]


def test_star_weight_takes_everything_ready() -> None:
    m = not_ready()
    a = local(["a0", "a1", "a2", "a3"])
    b = scripted(["b0", m, "b1", "b2", m, "b3"])
    out = list(a.union(b, round_robin_weights=[2, "*"]))
    assert out == ["a0", "a1", "b0", "a2", "a3", "b1", "b2", "b3"]


def test_weighted_child_that_is_not_ready_is_waited_for_in_order() -> None:
    m = not_ready()
    a = scripted([m, m, "a0", "a1"])
    b = local(["b0", "b1"])
    assert list(a.union(b, deterministic=True)) == ["a0", "b0", "a1", "b1"]


def test_async_union_moves_on_from_a_child_that_is_not_ready() -> None:
    m = not_ready()
    a = scripted([m, m, m, "a0"])
    b = local(["b0", "b1", "b2"])
    out = list(a.union(b))
    assert out.index("b2") < out.index("a0")


def test_async_union_blocks_on_the_event_of_an_idle_source() -> None:
    event = threading.Event()
    markers = 0

    def source(timeout: float | None) -> Iterator[Any]:
        nonlocal markers
        while not event.is_set():
            markers += 1
            yield NextValueNotReady(events=[event])
        yield "done"

    threading.Timer(0.3, event.set).start()
    out = LocalIterator(source).union(local([])).take(1)
    assert out == ["done"]
    assert markers <= 3  # one pass, one wait on the event; a polling loop would spin hundreds of times


def test_nested_non_blocking_union_hands_markers_up() -> None:
    m = not_ready()
    inner = scripted([m, "i0"]).union(scripted([m]))
    assert list(inner.union(local(["o0"]))) == ["o0", "i0"]


def test_union_rejects_bad_arguments() -> None:
    with pytest.raises(IteratorUsageError, match="2 entries for 3"):
        local([1]).union(local([2]), local([3]), round_robin_weights=[1, 2])
    with pytest.raises(IteratorUsageError, match="int >= 1 or"):
        local([1]).union(local([2]), round_robin_weights=[0, 1])
    with pytest.raises(IteratorUsageError, match="takes LocalIterators"):
        local([1]).union(cast(Any, [2]))


def test_bad_sizes_are_rejected() -> None:
    with pytest.raises(IteratorUsageError):
        local([1]).batch(0)
    with pytest.raises(IteratorUsageError):
        local([1]).shuffle(0)
    with pytest.raises(IteratorUsageError):
        local([1]).duplicate(0)


def test_shared_metrics_set_reaches_linked_holders() -> None:
    child = SharedMetrics()
    parent = SharedMetrics()
    parent.link(child)
    fresh = MetricsContext()
    parent.set(fresh)
    assert child.get() is fresh


# -- the stage graph and per-stage statistics ----------------------------------------------


def test_combinators_record_a_stage_graph() -> None:
    def double(x: int) -> int:
        return 2 * x

    it = local([1, 2], name="src").for_each(double).filter(bool).batch(2)
    kinds = [stage.kind for stage in it.stages]
    assert kinds == ["source", "for_each", "filter", "batch"]
    assert it.stage.inputs == (it.stages[2],) and it.stages[1].fn is double
    assert it.stages[1].label == "for_each(double)"
    a, b = local([1]).duplicate(2)
    merged = a.union(b.for_each(str))
    assert merged.stage.kind == "union"
    left, right = merged.stage.inputs
    assert left.kind == "duplicate" and right.inputs[0].kind == "duplicate"
    assert left.inputs[0] is right.inputs[0].inputs[0]  # both children read the same source stage


def test_stage_stats_count_items_and_attribute_time_to_the_stage_that_spent_it() -> None:
    import time as _time

    def slow(x: int) -> int:
        _time.sleep(0.01)
        return x

    it = local(list(range(5))).for_each(slow).filter(lambda x: x % 2 == 0)
    assert list(it) == [0, 2, 4]
    stats = it.shared_metrics.get().stage_stats
    source, mapped, kept = (stats[stage.id] for stage in it.stages)
    assert (source.items, mapped.items, kept.items) == (5, 5, 3)
    assert mapped.time_s >= 0.05  # five sleeps happened inside for_each
    assert source.time_s < mapped.time_s / 2 and kept.time_s < mapped.time_s / 2


def test_a_duplicate_branch_ahead_of_its_sibling_counts_the_time_it_was_held_back() -> None:
    import time as _time

    def slow(x: int) -> int:
        _time.sleep(0.01)
        return x

    ahead, behind = local(list(range(6))).duplicate(2)
    merged = ahead.batch(3).union(behind.for_each(slow))  # the batching branch wants 3 items per output
    assert sorted(merged.take(8), key=str) == sorted([[0, 1, 2], [3, 4, 5], *range(6)], key=str)
    stats = merged.shared_metrics.get().stage_stats
    ahead_stats, behind_stats = stats[ahead.stage.id], stats[behind.stage.id]
    # The batching branch waited for the sleeping one to take each item it had already passed on
    # (back-pressure), outside its own time; the slow branch was never ahead; nothing blocked in place.
    assert ahead_stats.held_s >= 0.03 and ahead_stats.held_s > ahead_stats.time_s
    assert behind_stats.held_s == 0 and ahead_stats.blocked_s == behind_stats.blocked_s == 0


def test_a_duplicate_branch_is_held_only_until_it_gets_its_next_item() -> None:
    import time as _time

    def slow(batch: list[int]) -> list[int]:
        _time.sleep(0.2)
        return batch

    first, second = local(list(range(8))).duplicate(2)
    merged = first.batch(2).for_each(slow).union(second.batch(2))
    assert sorted(merged.take(4)) == [[0, 1], [0, 1], [2, 3], [2, 3]]
    stats = merged.shared_metrics.get().stage_stats
    # The first branch waits briefly for the second to take item 0 and pull item 1 for it; the second then
    # waits through the first's slow step for item 3. Time after the first got its item is not a hold.
    assert stats[first.stage.id].held_s < 0.1
    assert stats[second.stage.id].held_s >= 0.2
