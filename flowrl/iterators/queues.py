"""A thread-safe queue that exposes its state as events, so dataflows can wait on it.

A source reading from an :class:`EventQueue` (or an operator writing to one) that would
block yields ``NextValueNotReady(events=[...])`` instead, and a union waits on the event
rather than polling the queue.
"""

from __future__ import annotations

import queue
import threading
from typing import TypeVar

T = TypeVar("T")


class EventQueue(queue.Queue[T]):
    """A :class:`queue.Queue` with ``not_empty_event`` and ``not_full_event``.

    ``not_empty_event`` is set whenever the queue holds an item and ``not_full_event``
    whenever it has room; both are kept up to date under the queue's own lock.
    """

    def __init__(self, maxsize: int = 0) -> None:
        super().__init__(maxsize)
        self.not_empty_event = threading.Event()
        self.not_full_event = threading.Event()
        self.not_full_event.set()

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
