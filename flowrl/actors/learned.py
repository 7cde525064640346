"""What learning on one batch produced, as learners hand it to a plan.

:class:`Learned` is the item a :class:`~flowrl.actors.LearnerThread` puts on its outqueue
(and what a :class:`~flowrl.actors.LearnerGroup` returns for one batch);
:class:`LearnerInfo` is the ``info`` of ``TrainOneStep``'s ``(batch, info)``: per policy its
learner statistics, with the replayed rows' new :data:`Priorities` beside them as a typed
attribute. Neither module of the learners imports the other for these names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

#: Per policy id, the replayed rows' indexes and their new TD errors (what replay buffers take).
Priorities = Mapping[str, tuple[np.ndarray, np.ndarray]]


class Learned(NamedTuple):
    """What learning on one batch produced.

    ``source``: the actor the batch came from (a replay shard), or None.
    ``info``: per policy id, its learner statistics.
    ``steps``: env steps in the batch.
    ``priorities``: new priorities of the replayed rows, per policy id (empty unless the
    batch was replayed and the loss gave TD errors).
    """

    source: Any
    info: dict[str, dict[str, float]]
    steps: int
    priorities: Priorities = {}


class LearnerInfo(dict[str, dict[str, float]]):
    """Per policy id, its learner statistics (a plain mapping to read, as RLlib's learner info),
    and ``priorities``: the new priorities of the replayed rows learned on, per policy id (empty
    unless the batch was replayed and the loss gave TD errors). The priorities are an attribute,
    never an entry: the statistics stay what ``result["info"]["learner"]`` shows."""

    def __init__(
        self, stats: Mapping[str, dict[str, float]] | None = None, priorities: Priorities | None = None
    ) -> None:
        super().__init__(stats or {})
        self.priorities: Priorities = priorities if priorities is not None else {}

    def __repr__(self) -> str:
        return f"LearnerInfo({dict.__repr__(self)}, priorities={sorted(self.priorities)})"
