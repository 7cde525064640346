"""The operator protocol: what plan graphs and checkpoints read from an operator.

An operator is any callable a plan passes to ``for_each``, ``filter``, ``combine`` or
``transform``. Plain functions are fine; an operator that touches actors, or keeps state a
checkpoint must hold, says so by deriving from :class:`Operator` or :class:`StatefulOperator`:

- :meth:`Operator.plan_links` names what it does to which actors (``ActorLink``: this
  operator -> an actor class, e.g. "broadcast weights" to ``RolloutWorker``), or which actors
  feed which (``ActorFlow``, e.g. rollout workers -> aggregators), for the plan graph;
- :meth:`Operator.plan_actor_counts` counts actors no gather shows (behind aggregators);
- :meth:`Operator.plan_stats` adds figures of its own to the plan's X-ray (cumulative seconds
  or counts, e.g. the batches it received and their policy lag), reported per iteration;
- ``plan_hidden = True`` leaves plumbing (tagging, dropping Nones) out of the graph;
- a :class:`StatefulOperator` names its state with a fixed ``state_key``: checkpoints store
  its state under that key, so renaming its class or adding methods to another operator
  changes neither graphs nor checkpoints.

The plan (:mod:`flowrl.plan`) reads only these declarations, never other attributes.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True)
class ActorLink:
    """The operator acts on the actors of ``actor_class``; ``label`` says how (an edge operator -> actors)."""

    actor_class: str
    label: str


@dataclass(frozen=True)
class ActorFlow:
    """Actors of ``source`` feed actors of ``target`` outside the driver (an edge actors -> actors)."""

    source: str
    target: str
    label: str


PlanLink = ActorLink | ActorFlow


class Operator:
    """Base of operators that declare something to the plan graph; see the module docs."""

    #: Plumbing the plan graph leaves out (its inputs connect straight to its outputs).
    plan_hidden: ClassVar[bool] = False

    def plan_links(self) -> Sequence[PlanLink]:
        """What this operator does to actors, for the plan graph (none by default)."""
        return ()

    def plan_actor_counts(self) -> Mapping[str, int]:
        """How many actors of each class stand behind this operator where no gather shows them."""
        return {}

    def plan_stats(self) -> Mapping[str, float]:
        """Cumulative figures of this operator for the plan's X-ray (none by default); the plan reports
        how much each grew in an iteration."""
        return {}


class HiddenOperator(Operator):
    """Plumbing: an operator the plan graph does not show."""

    plan_hidden = True


class StatefulOperator(Operator, abc.ABC):
    """An operator whose state checkpoints keep, under its ``state_key``.

    ``state_key`` is a fixed name (not the class name): a plan holding two operators with
    the same key numbers the second ``"<key>#1"`` in dataflow order.
    """

    state_key: ClassVar[str]

    @abc.abstractmethod
    def get_state(self) -> dict[str, Any]:
        """What a checkpoint must hold to resume this operator where it was."""

    @abc.abstractmethod
    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`get_state`'s output."""
