"""What replay operators use of a replay buffer, as a Protocol: a
:class:`~flowrl.data.LocalReplayBuffer` has it, and so may a stand-in that is no subclass of it
(a test double, a buffer of another design)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np

from flowrl.data.sample_batch import MultiAgentBatch, SampleBatch


class ReplayBufferLike(Protocol):
    """A buffer of experience per policy: batches go in, replayed batches come out, and the
    priorities of replayed rows can be updated (a no-op for a uniform buffer)."""

    def add_batch(self, batch: SampleBatch | MultiAgentBatch) -> None:
        """Store ``batch``'s rows (each policy's in its own buffer)."""
        ...

    def replay(self) -> SampleBatch | MultiAgentBatch | None:
        """A batch of stored rows, or None while the buffer holds too few to learn from."""
        ...

    def update_priorities(self, prio_dict: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> None:
        """Set new priorities: per policy id, the replayed rows' indexes and their TD errors."""
        ...
