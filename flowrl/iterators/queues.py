"""A thread-safe queue that exposes its state as events, so dataflows can wait on it.

A source reading from an :class:`EventQueue` (or an operator writing to one) that would
block yields ``NextValueNotReady(events=[...])`` instead, and a union waits on the event
rather than polling the queue. :func:`as_event_queue` turns a standard :class:`queue.Queue`
that a producer already holds into an :class:`EventQueue`, in place.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, TypeVar, cast

from flowrl.errors import FlowRLError

T = TypeVar("T")


class EventQueue(queue.Queue[T]):
    """A :class:`queue.Queue` with ``not_empty_event`` and ``not_full_event``.

    ``not_empty_event`` is set whenever the queue holds an item and ``not_full_event``
    whenever it has room; both are kept up to date under the queue's own lock.
    """

    not_empty_event: threading.Event
    not_full_event: threading.Event

    def __init__(self, maxsize: int = 0) -> None:
        super().__init__(maxsize)
        self._init_events()

    def _init_events(self) -> None:
        """Create both events to match what the queue holds now.

        Call with the mutex held, or before another thread can reach the queue.
        """
        self.not_empty_event = threading.Event()
        self.not_full_event = threading.Event()
        if self._qsize() > 0:
            self.not_empty_event.set()
        if not 0 < self.maxsize <= self._qsize():
            self.not_full_event.set()

    # queue.Queue calls _put and _get with its mutex held, so the events change in the same
    # critical section as the items and never disagree with the queue for another thread.
    def _put(self, item: T) -> None:
        super()._put(item)
        self.not_empty_event.set()
        if 0 < self.maxsize <= self._qsize():
            self.not_full_event.clear()

    def _get(self) -> T:
        item = super()._get()
        self.not_full_event.set()
        if self._qsize() == 0:
            self.not_empty_event.clear()
        return item


_event_queue_classes: dict[type[queue.Queue[Any]], type[EventQueue[Any]]] = {queue.Queue: EventQueue}
_event_queue_classes_lock = threading.Lock()


def _event_queue_class(queue_class: type[queue.Queue[Any]]) -> type[EventQueue[Any]]:
    """An :class:`EventQueue` that stores items the way ``queue_class`` does (LIFO, by priority...).

    :class:`EventQueue` comes first in the MRO, so its ``_put``/``_get`` wrap ``queue_class``'s.
    One class per ``queue_class``, so converted queues of one kind share a type.
    """
    with _event_queue_classes_lock:
        event_class = _event_queue_classes.get(queue_class)
        if event_class is None:
            namespace = {"__module__": __name__, "__doc__": f"A {queue_class.__qualname__} with EventQueue's events."}
            # type() with a base known only at run time cannot be typed statically; its bases
            # make the class an EventQueue subclass, which the cast states.
            event_class = cast(
                "type[EventQueue[Any]]", type(f"Event{queue_class.__name__}", (EventQueue, queue_class), namespace)
            )
            _event_queue_classes[queue_class] = event_class
        return event_class


def as_event_queue(q: queue.Queue[T]) -> EventQueue[T]:
    """Turn a standard :class:`queue.Queue` into an :class:`EventQueue` in place, and return it.

    ``q`` may be a FIFO ``queue.Queue``, a ``LifoQueue``, a ``PriorityQueue`` or a subclass;
    an :class:`EventQueue` is returned unchanged. The same object is converted, not copied or
    wrapped, because the thread producing into the queue holds a reference to that object:
    from then on every ``put`` and ``get``, by any thread and through any reference, keeps
    the events up to date, and nobody has to poll the queue. Under the queue's own mutex, the
    object's class becomes a subclass of both :class:`EventQueue` and its old class, and the
    events are set from what it holds; it keeps its items, its order and ``isinstance``
    against its old class (only ``type(q)`` changes). Safe to call while other threads use it.

    The events follow the ``_put``/``_get`` hooks through which ``queue.Queue`` and its
    standard subclasses store and remove items. Raises :class:`~flowrl.errors.FlowRLError`
    for other queues (``queue.SimpleQueue``, ``multiprocessing.Queue``, ``asyncio.Queue``),
    whose changes could only be noticed by polling them.
    """
    if not isinstance(q, queue.Queue):
        raise FlowRLError(
            "as_event_queue() needs a queue.Queue (or a subclass such as LifoQueue or PriorityQueue), "
            f"got {type(q).__module__}.{type(q).__qualname__}, which has no hooks that run under a lock "
            "on every put and get, so its changes could only be noticed by polling it; create a "
            "flowrl.iterators.EventQueue and hand that to the producer instead"
        )
    # Every put and get runs _put/_get with this mutex held, so no thread sees the class
    # changed but the events not yet set; checking for an EventQueue under it too means two
    # threads converting the same queue convert it once.
    with q.mutex:
        if isinstance(q, EventQueue):
            return q
        try:
            q.__class__ = _event_queue_class(type(q))
        except TypeError as err:  # a class that refuses subclasses, or whose objects have another layout
            raise FlowRLError(
                f"as_event_queue() cannot convert a {type(q).__qualname__} in place ({err}), and "
                "without that its changes could only be noticed by polling it; create a "
                "flowrl.iterators.EventQueue and hand that to the producer instead"
            ) from err
        converted = cast("EventQueue[T]", q)  # mypy does not follow the __class__ assignment
        converted._init_events()
    return converted
