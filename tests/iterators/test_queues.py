"""as_event_queue: standard queues converted in place keep their events in step with every put and get."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import pytest

from flowrl.errors import FlowRLError
from flowrl.iterators import EventQueue, as_event_queue

pytestmark = pytest.mark.unit


def put_from_thread(q: queue.Queue[Any], items: list[Any]) -> threading.Thread:
    """Put ``items`` on ``q`` from another thread, as a producer holding the queue would."""

    def produce() -> None:
        for item in items:
            q.put(item)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    return thread


@pytest.mark.timeout(20)
def test_puts_from_another_thread_wake_a_waiter() -> None:
    plain: queue.Queue[int] = queue.Queue()
    q = as_event_queue(plain)
    assert q is plain
    woke = threading.Event()

    def wait() -> None:
        if q.not_empty_event.wait(10):
            woke.set()

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    assert not woke.wait(0.05)  # nothing put yet: the waiter sleeps
    put_from_thread(plain, [7]).join(10)  # through the producer's reference to the same object
    assert woke.wait(10)
    waiter.join(10)
    assert q.get_nowait() == 7


def test_events_follow_full_and_empty_transitions() -> None:
    q = as_event_queue(queue.Queue[int](maxsize=2))
    assert not q.not_empty_event.is_set() and q.not_full_event.is_set()
    q.put(1)
    assert q.not_empty_event.is_set() and q.not_full_event.is_set()
    q.put(2)
    assert q.not_empty_event.is_set() and not q.not_full_event.is_set()
    with pytest.raises(queue.Full):
        q.put_nowait(3)
    assert q.get() == 1
    assert q.not_empty_event.is_set() and q.not_full_event.is_set()
    assert q.get_nowait() == 2
    assert not q.not_empty_event.is_set() and q.not_full_event.is_set()


def test_a_lifo_queue_keeps_its_order() -> None:
    lifo: queue.LifoQueue[str] = queue.LifoQueue(maxsize=3)
    q = as_event_queue(lifo)
    assert isinstance(q, EventQueue) and isinstance(q, queue.LifoQueue)
    for item in "abc":
        q.put(item)
    assert not q.not_full_event.is_set()
    assert [q.get() for _ in range(3)] == ["c", "b", "a"]
    assert not q.not_empty_event.is_set() and q.not_full_event.is_set()


def test_a_priority_queue_keeps_its_order() -> None:
    q = as_event_queue(queue.PriorityQueue[int]())
    for item in (3, 1, 2):
        q.put(item)
    assert [q.get() for _ in range(3)] == [1, 2, 3]
    assert not q.not_empty_event.is_set()


@pytest.mark.parametrize("held, maxsize, full", [(2, 0, False), (2, 3, False), (3, 3, True)])
def test_a_queue_holding_items_starts_with_matching_events(held: int, maxsize: int, full: bool) -> None:
    plain: queue.Queue[int] = queue.Queue(maxsize)
    for i in range(held):
        plain.put(i)
    q = as_event_queue(plain)
    assert q.not_empty_event.is_set()
    assert q.not_full_event.is_set() is not full
    assert [q.get() for _ in range(held)] == list(range(held))  # nothing lost or reordered
    assert not q.not_empty_event.is_set() and q.not_full_event.is_set()


@pytest.mark.timeout(20)
def test_a_producer_blocked_on_a_full_queue_is_woken_after_conversion() -> None:
    plain: queue.Queue[int] = queue.Queue(maxsize=1)
    plain.put(0)
    producer = put_from_thread(plain, [1])
    time.sleep(0.05)  # let it block in put() on the full queue (the outcome must not depend on it)
    q = as_event_queue(plain)
    assert not q.not_full_event.is_set()
    assert q.get(timeout=10) == 0
    producer.join(10)
    assert not producer.is_alive()
    assert q.not_empty_event.is_set() and not q.not_full_event.is_set()  # its put ran the new _put
    assert q.get_nowait() == 1


@pytest.mark.timeout(20)
def test_a_consumer_blocked_on_an_empty_queue_gets_the_next_put() -> None:
    plain: queue.Queue[int] = queue.Queue()
    got: list[int] = []
    consumer = threading.Thread(target=lambda: got.append(plain.get(timeout=10)), daemon=True)
    consumer.start()
    time.sleep(0.05)  # let it block in get() on the empty queue (the outcome must not depend on it)
    q = as_event_queue(plain)
    q.put(5)
    consumer.join(10)
    assert got == [5]
    assert not q.not_empty_event.is_set()  # its get ran the new _get


@pytest.mark.timeout(60)
def test_converting_while_a_producer_puts_loses_no_update() -> None:
    plain: queue.Queue[int] = queue.Queue()
    producer = put_from_thread(plain, list(range(20_000)))
    q = as_event_queue(plain)
    producer.join(30)
    assert q.not_empty_event.is_set()
    assert [q.get_nowait() for _ in range(20_000)] == list(range(20_000))
    assert not q.not_empty_event.is_set()


def test_conversion_is_idempotent_and_classes_are_shared() -> None:
    own = EventQueue[int]()
    assert as_event_queue(own) is own and type(own) is EventQueue
    first, second = as_event_queue(queue.LifoQueue[int]()), as_event_queue(queue.LifoQueue[int]())
    assert type(first) is type(second)
    events = first.not_empty_event
    assert as_event_queue(first) is first and first.not_empty_event is events


@pytest.mark.parametrize("not_a_queue", [queue.SimpleQueue(), [1, 2]])
def test_a_queue_without_put_get_hooks_is_refused(not_a_queue: Any) -> None:
    with pytest.raises(FlowRLError, match="polling"):
        as_event_queue(not_a_queue)


def test_a_queue_class_that_refuses_subclasses_is_refused() -> None:
    class FinalQueue(queue.Queue[Any]):
        def __init_subclass__(cls, **kwargs: Any) -> None:
            raise TypeError("FinalQueue cannot be subclassed")

    q = FinalQueue()
    with pytest.raises(FlowRLError, match="cannot convert a .*FinalQueue in place"):
        as_event_queue(q)
    assert type(q) is FinalQueue
    q.put(1)  # left working as it was
    assert q.get_nowait() == 1
