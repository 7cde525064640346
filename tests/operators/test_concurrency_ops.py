"""Concurrently, Enqueue/Dequeue and EventQueue: merge orders, back-pressure, blocking without spinning."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterator, cast

import pytest
from fakes import from_list

from flowrl.errors import FlowRLError
from flowrl.iterators import EventQueue, LocalIterator, NextValueNotReady
from flowrl.operators import Concurrently, Dequeue, Enqueue

pytestmark = pytest.mark.unit


def from_generator(make: Callable[[], Iterator[Any]]) -> LocalIterator[Any]:
    return LocalIterator(lambda timeout: make())


class MarkerCounter:
    """A transform that counts the not-ready markers passing through it."""

    def __init__(self) -> None:
        self.markers = 0

    def __call__(self, items: Iterator[Any]) -> Iterator[Any]:
        for item in items:
            if isinstance(item, NextValueNotReady):
                self.markers += 1
            yield item


def put_later(q: EventQueue, item: Any, delay_s: float) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(delay_s), q.put(item)), daemon=True)
    thread.start()
    return thread


# --- Concurrently ---


def test_round_robin_with_weights_gives_the_exact_order() -> None:
    a = from_list(f"a{i}" for i in range(6))
    b = from_list(f"b{i}" for i in range(3))
    out = Concurrently([a, b], mode="round_robin", round_robin_weights=[2, 1])
    assert list(out) == ["a0", "a1", "b0", "a2", "a3", "b1", "a4", "a5", "b2"]


def test_round_robin_without_weights_alternates_and_drops_exhausted_flows() -> None:
    out = Concurrently([from_list([1, 2, 3, 4]), from_list(["x"])], mode="round_robin")
    assert list(out) == [1, "x", 2, 3, 4]


def test_star_weight_takes_everything_a_flow_has_ready() -> None:
    ready = threading.Event()
    ready.set()

    def bursts() -> Iterator[Any]:
        yield "a0"
        yield "a1"
        yield NextValueNotReady(events=[ready])
        yield "a2"
        yield "a3"
        yield NextValueNotReady(events=[ready])
        yield "a4"

    out = Concurrently([from_generator(bursts), from_list(["b0", "b1", "b2", "b3"])], round_robin_weights=["*", 1])
    assert list(out) == ["a0", "a1", "b0", "a2", "a3", "b1", "a4", "b2", "b3"]


def test_output_indexes_keep_only_chosen_outputs_but_every_flow_runs() -> None:
    seen: list[int] = []
    a = from_list(range(4)).for_each(lambda x: seen.append(x) or x)
    b = from_list(["b0", "b1", "b2", "b3"])
    out = Concurrently([a, b], mode="round_robin", output_indexes=[1])
    assert list(out) == ["b0", "b1", "b2", "b3"]
    assert seen == [0, 1, 2, 3]


def test_output_indexes_in_async_mode() -> None:
    seen: list[int] = []
    a = from_list(range(5)).for_each(lambda x: seen.append(x) or x)
    b = from_list([10, 11, 12])
    out = list(Concurrently([a, b], mode="async", output_indexes=[0]))
    assert out == [0, 1, 2, 3, 4]
    assert seen == [0, 1, 2, 3, 4]


def test_async_mode_yields_every_item_keeping_each_flows_order() -> None:
    out = list(Concurrently([from_list(range(5)), from_list(range(10, 15))], mode="async"))
    assert sorted(out) == [0, 1, 2, 3, 4, 10, 11, 12, 13, 14]
    assert [x for x in out if x < 10] == [0, 1, 2, 3, 4]
    assert [x for x in out if x >= 10] == [10, 11, 12, 13, 14]


def test_sub_flows_share_one_metrics_context() -> None:
    def count(name: str) -> Callable[[Any], Any]:
        def fn(item: Any) -> Any:
            LocalIterator.get_metrics().counters[name] += 1
            return item

        return fn

    a = from_list(range(3)).for_each(count("a"))
    b = from_list(range(2)).for_each(count("b"))
    out = Concurrently([a, b], mode="round_robin", output_indexes=[0])
    assert len(list(out)) == 3
    counters = out.shared_metrics.get().counters
    assert (counters["a"], counters["b"]) == (3, 2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"ops": "one"}, "at least 2"),
        ({"mode": "bogus"}, "bogus"),
        ({"mode": "async", "round_robin_weights": [1, 1]}, "round_robin_weights"),
        ({"output_indexes": [2]}, r"\[2\] out of range"),
        ({"output_indexes": [-1]}, r"\[-1\] out of range"),
    ],
)
def test_invalid_arguments_raise_flowrl_errors(kwargs: dict[str, Any], match: str) -> None:
    ops = [from_list([1]), from_list([2])]
    if kwargs.pop("ops", None) == "one":
        ops = ops[:1]
    with pytest.raises(FlowRLError, match=match):
        Concurrently(ops, **kwargs)


def test_weights_of_the_wrong_length_raise_a_flowrl_error() -> None:
    with pytest.raises(FlowRLError, match="round_robin_weights"):
        Concurrently([from_list([1]), from_list([2])], round_robin_weights=[1, 1, 1])


# --- EventQueue ---


def test_event_queue_events_track_its_state() -> None:
    q = EventQueue(maxsize=2)
    assert not q.not_empty_event.is_set() and q.not_full_event.is_set()
    q.put(1)
    assert q.not_empty_event.is_set() and q.not_full_event.is_set()
    q.put(2)
    assert q.not_empty_event.is_set() and not q.not_full_event.is_set()
    assert q.get() == 1
    assert q.not_empty_event.is_set() and q.not_full_event.is_set()
    assert q.get_nowait() == 2
    assert not q.not_empty_event.is_set() and q.not_full_event.is_set()


def test_unbounded_event_queue_is_never_full() -> None:
    q = EventQueue()
    for i in range(100):
        q.put_nowait(i)
    assert q.not_full_event.is_set() and q.not_empty_event.is_set()


# --- Enqueue ---


@pytest.mark.timeout(20)
def test_enqueue_on_a_full_queue_yields_not_ready_and_drops_nothing() -> None:
    q = EventQueue(maxsize=2)
    flow = from_list(range(6)).transform(Enqueue(q))
    assert [next(flow), next(flow)] == [0, 1]
    marker = next(flow)
    assert isinstance(marker, NextValueNotReady)
    assert q.not_full_event in marker.events and not q.not_full_event.is_set()
    assert isinstance(next(flow), NextValueNotReady)  # still full: still not ready, item kept
    assert q.qsize() == 2

    consumed: list[int] = []

    def consume() -> None:
        for _ in range(6):
            consumed.append(q.get(timeout=10))
            time.sleep(0.01)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    passed: list[int] = []
    while len(passed) < 4:
        item = next(flow)
        if isinstance(item, NextValueNotReady):
            assert item.events, "a full-queue marker must name the event to wait on"
            item.events[0].wait(timeout=5)
        else:
            passed.append(item)
    with pytest.raises(StopIteration):
        next(flow)
    consumer.join(timeout=10)
    assert passed == [2, 3, 4, 5]
    assert consumed == [0, 1, 2, 3, 4, 5]
    # The seconds it held items the full queue had no room for: back-pressure, outside its own time.
    enqueue = flow.shared_metrics.get().stage_stats[flow.stage.id]
    assert enqueue.held_s >= 0.02 and enqueue.blocked_s == 0


@pytest.mark.timeout(20)
def test_for_each_of_enqueue_enqueues_as_transform_does() -> None:
    """RLlib Flow plans write ``flow.for_each(Enqueue(q))``: it puts the items on the queue,
    with the same back-pressure and the same stage as ``flow.transform(Enqueue(q))``."""
    import queue

    q: queue.Queue[int] = queue.Queue()
    flow = from_list([1, 2, 3]).for_each(Enqueue(q))
    assert flow.take(3) == [1, 2, 3]
    assert [q.get_nowait() for _ in range(3)] == [1, 2, 3]
    assert repr(flow) == repr(from_list([]).transform(Enqueue(q)))
    assert flow.stage.kind == "transform" and flow.stage.label == "transform(Enqueue)"

    full = EventQueue(maxsize=1)
    held = from_list(range(3)).for_each(Enqueue(full))
    assert next(held) == 0
    marker = next(held)  # the queue is full: not ready, the item kept
    assert isinstance(marker, NextValueNotReady) and full.not_full_event in marker.events
    assert full.get_nowait() == 0 and next(held) == 1 and full.qsize() == 1


def test_enqueue_and_dequeue_need_a_queue_they_can_wait_on() -> None:
    import queue

    with pytest.raises(FlowRLError, match="EventQueue"):
        Enqueue(cast(Any, queue.SimpleQueue()))
    with pytest.raises(FlowRLError, match="EventQueue"):
        Dequeue(cast(Any, []))


@pytest.mark.timeout(20)
def test_standard_queues_as_rllib_flow_plans_pass_them_work_without_polling() -> None:
    import queue

    inbox: queue.Queue[int] = queue.Queue(maxsize=2)
    outbox: queue.Queue[int] = queue.Queue()
    stop = threading.Event()

    def worker() -> None:  # a background thread holding the plain queues, as a learner thread would
        while not stop.is_set():
            try:
                outbox.put(10 * inbox.get(timeout=0.05))
            except queue.Empty:
                continue

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    feed = from_list(range(5)).transform(Enqueue(inbox))
    results = Dequeue(outbox)
    flow = Concurrently([feed, results], mode="async", output_indexes=[1])
    try:
        assert sorted(next(flow) for _ in range(5)) == [0, 10, 20, 30, 40]
    finally:
        stop.set()
        thread.join(timeout=5)
    assert isinstance(inbox, EventQueue) and isinstance(outbox, EventQueue)  # converted in place


# --- Dequeue ---


@pytest.mark.timeout(20)
def test_dequeue_alone_blocks_until_an_item_arrives() -> None:
    q = EventQueue()
    checks: list[int] = []
    source = Dequeue(q, check=lambda: checks.append(1) or True)
    put_later(q, "item", 0.3)
    start = time.monotonic()
    assert next(source) == "item"
    assert time.monotonic() - start >= 0.25
    assert len(checks) <= 3  # woke up for the item, not by polling


@pytest.mark.timeout(20)
def test_dequeue_yields_queued_items_in_order() -> None:
    q = EventQueue()
    for i in range(5):
        q.put(i)
    assert Dequeue(q).take(5) == [0, 1, 2, 3, 4]


@pytest.mark.timeout(20)
def test_dequeue_in_a_union_blocks_on_the_queue_event_without_spinning() -> None:
    q = EventQueue()
    counter = MarkerCounter()
    out = Concurrently([Dequeue(q).transform(counter), from_list(["first"])], mode="async")
    assert next(out) == "first"
    put_later(q, "late", 0.5)
    start = time.monotonic()
    assert next(out) == "late"
    assert time.monotonic() - start >= 0.4
    # One marker per wake-up; a spinning union would produce thousands in 0.5 s.
    assert counter.markers <= 5


@pytest.mark.timeout(20)
def test_two_idle_dequeues_in_a_union_back_off_instead_of_spinning() -> None:
    q1, q2 = EventQueue(), EventQueue()
    c1, c2 = MarkerCounter(), MarkerCounter()
    out = Concurrently([Dequeue(q1).transform(c1), Dequeue(q2).transform(c2)], mode="async")
    put_later(q2, "from q2", 0.5)
    assert next(out) == "from q2"
    # Two events cannot be waited on as one: a capped backoff (<= 20 ms) is allowed, spinning is not.
    assert c1.markers + c2.markers < 150


def test_dequeue_raises_when_check_fails_on_an_empty_queue() -> None:
    q = EventQueue()
    with pytest.raises(FlowRLError, match="check"):
        next(Dequeue(q, check=lambda: False))


def test_dequeue_inside_a_union_raises_when_check_fails() -> None:
    q1, q2 = EventQueue(), EventQueue()
    out = Concurrently([Dequeue(q1, check=lambda: False), Dequeue(q2)], mode="async")
    with pytest.raises(FlowRLError, match="check"):
        next(out)


def test_dequeue_still_serves_queued_items_while_check_fails() -> None:
    q = EventQueue()
    q.put("left over")
    source = Dequeue(q, check=lambda: False)
    assert next(source) == "left over"
    with pytest.raises(FlowRLError):
        next(source)


@pytest.mark.timeout(20)
def test_blocking_dequeue_notices_a_producer_that_dies_while_it_waits() -> None:
    q = EventQueue()
    alive = [True]
    threading.Thread(target=lambda: (time.sleep(0.2), alive.__setitem__(0, False)), daemon=True).start()
    start = time.monotonic()
    with pytest.raises(FlowRLError, match="check"):
        next(Dequeue(q, check=lambda: alive[0]))
    assert time.monotonic() - start < 5


@pytest.mark.timeout(30)
def test_dequeue_in_a_union_notices_a_producer_that_dies_while_it_waits() -> None:
    q = EventQueue()
    alive = [True]
    out = Concurrently([Dequeue(q, check=lambda: alive[0]), from_list(["first"])], mode="async")
    assert next(out) == "first"
    outcome: list[Any] = []

    def pull() -> None:
        try:
            outcome.append(next(out))
        except Exception as e:  # noqa: BLE001 - the test inspects it
            outcome.append(e)

    puller = threading.Thread(target=pull, daemon=True)
    puller.start()
    time.sleep(0.2)
    alive[0] = False  # the producer died without putting anything
    puller.join(timeout=2.5)  # a blocking Dequeue re-runs check() every second
    hung = puller.is_alive()
    if hung:
        q.put("unblock")  # release the stuck thread before failing
        puller.join(timeout=5)
    assert not hung, "next() on the union still blocks 2.5 s after check() turned False"
    assert isinstance(outcome[0], FlowRLError)
