"""Placeholder actors: what a plan is built over when only its graph is wanted (``flowrl plan``).

Inside :func:`placeholder_actors`, the places that start a plan's actors (the remote rollout
workers of a :class:`~flowrl.actors.WorkerSet`, replay shards, aggregators) make a
:class:`PlaceholderActor` of the same class instead, and reserve nothing: the plan records
the same operators, actors and edges as over real actors, without Ray. A placeholder serves
no call; one that reaches it raises, since the real build would have started work there.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any, NoReturn

from flowrl.errors import FlowRLError

_ACTIVE: contextvars.ContextVar[bool] = contextvars.ContextVar("flowrl_placeholder_actors", default=False)


@contextlib.contextmanager
def placeholder_actors() -> Iterator[None]:
    """Make the actors started in the block placeholders (in this thread or task)."""
    token = _ACTIVE.set(True)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def placeholders_active() -> bool:
    """Whether actors started now should be placeholders (inside :func:`placeholder_actors`)."""
    return _ACTIVE.get()


class PlaceholderActor:
    """Stands in for an actor of class ``class_name``: the plan graph shows it as one, and any method
    call (``actor.method.remote(...)``) raises :class:`~flowrl.errors.FlowRLError`."""

    def __init__(self, class_name: str) -> None:
        self.class_name = class_name

    def __getattr__(self, name: str) -> _PlaceholderMethod:
        if name.startswith("_"):
            raise AttributeError(name)
        return _PlaceholderMethod(self, name)

    def __repr__(self) -> str:
        return f"PlaceholderActor({self.class_name})"


class _PlaceholderMethod:
    """A method of a placeholder actor: calling it, in any of Ray's ways, raises."""

    def __init__(self, actor: PlaceholderActor, name: str) -> None:
        self._actor = actor
        self._name = name

    def remote(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise FlowRLError(
            f"{self._actor!r}.{self._name}() was called while building a plan over placeholder actors: "
            "such a plan shows its graph only and cannot run"
        )

    def options(self, **options: Any) -> _PlaceholderMethod:
        return self
