"""Placeholder actors: what a plan is built over when only its graph is wanted (``flowrl plan``).

Inside :func:`placeholder_actors`, the places that start a plan's actors (the remote rollout
workers of a :class:`~flowrl.actors.WorkerSet`, replay shards, aggregators) make a
:class:`PlaceholderActor` of the same class instead, and reserve nothing: the plan records
the same operators, actors and edges as over real actors, without Ray. A placeholder serves
no call; one that reaches it raises, since the real build would have started work there.

The local rollout worker is a :class:`PlaceholderLocalWorker`: it builds no env, and no policy
unless the build asks for one (no built-in plan's build does: they read policy classes and
specs), so that plans are declared without PyTorch.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from flowrl.data import DEFAULT_POLICY_ID
from flowrl.errors import FlowRLError

if TYPE_CHECKING:
    from flowrl.config import TrainerConfig
    from flowrl.policy import Policy, PolicySpec

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


class PlaceholderLocalWorker:
    """Stands in for the local :class:`~flowrl.actors.RolloutWorker` of a plan built over placeholders.

    Serves what building a plan reads from the local worker: its config, whether its env is
    multi-agent, its lock, each policy's class (:meth:`policy_class`, without building it) and a
    policy itself (:meth:`get_policy`, built from its spec on first use, which loads PyTorch).
    Anything else (sampling, weights, state) raises :class:`~flowrl.errors.FlowRLError`.
    """

    worker_index = 0

    def __init__(self, policy_specs: Mapping[str, PolicySpec], config: TrainerConfig, *, multi_agent: bool) -> None:
        self.config = config
        self.multi_agent = multi_agent
        self.lock = threading.RLock()
        self._specs = dict(policy_specs)
        self._built: dict[str, Policy[Any]] = {}

    def policy_class(self, policy_id: str = DEFAULT_POLICY_ID) -> type:
        """The class of policy ``policy_id`` (not built)."""
        return self._specs[policy_id].policy_class

    def get_policy(self, policy_id: str = DEFAULT_POLICY_ID) -> Policy[Any]:
        """Policy ``policy_id``, built from its spec the first time it is asked for."""
        if policy_id not in self._built:
            self._built[policy_id] = self._specs[policy_id].build()
        return self._built[policy_id]

    def stop(self) -> None:
        """Nothing to release: the placeholder holds no env."""

    def __getattr__(self, name: str) -> NoReturn:
        raise FlowRLError(
            f"the local worker's {name!r} was read while building a plan over placeholder actors: "
            "such a plan shows its graph only and cannot run"
        )
