"""Replay buffers: uniform, prioritized, and the per-policy buffer that plans drive.

* :class:`ReplayBuffer` keeps the last ``capacity`` rows of experience in preallocated
  NumPy columns (a ring) and samples rows uniformly with replacement.
* :class:`PrioritizedReplayBuffer` samples row ``i`` with probability
  ``P(i) = p_i**alpha / sum_k p_k**alpha`` and returns the importance weights
  ``(N * P(i))**-beta / max_j (N * P(j))**-beta`` that correct the bias this introduces
  (Schaul et al., "Prioritized Experience Replay", 2016). Sampling is stratified: the
  priority mass is cut into ``num_items`` equal segments and one row is drawn from each,
  as in Ape-X (Horgan et al., "Distributed Prioritized Experience Replay", 2018).
* :class:`LocalReplayBuffer` is what execution plans and ``ReplayActor`` use: one buffer per
  policy id, ``add_batch()``, ``replay()`` (``None`` until ``learning_starts`` env steps have
  been added) and ``update_priorities()`` from TD errors.

Every buffer has its own seeded NumPy generator, saved by ``get_state()``, so a restored
buffer samples exactly what the original would have. A buffer's rows can stay out of its state:
``get_state(include_contents=True, write_column=...)`` hands each column's filled rows (a view, not
a copy) to a writer that stores them (a checkpoint's files) and keeps what it returns in their
place; ``set_state(state, read_column=...)`` reads them back into the newly allocated columns.
"""

from __future__ import annotations

import numbers
import zlib
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from flowrl.data.compression import CompressedColumn, decompress_array
from flowrl.data.sample_batch import (
    MultiAgentBatch,
    SampleBatch,
    as_policy_batches,
)
from flowrl.data.segment_tree import MinSegmentTree, SumSegmentTree
from flowrl.data.sequence_replay import from_items, sequence_windows, to_items
from flowrl.errors import ReplayBufferError

__all__ = ["LocalReplayBuffer", "PrioritizedReplayBuffer", "ReplayBuffer", "ReplayBufferError"]

Seed = int | np.random.SeedSequence | None

BATCH_INDEXES = "batch_indexes"
"""Column added to sampled batches: each row's position in its buffer (for ``update_priorities``)."""


class ColumnSource(Protocol):
    """Rows kept outside a buffer's state (e.g. a checkpoint's file), read back into an array the buffer allocates."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> np.dtype[Any]: ...

    def read_into(self, out: np.ndarray) -> None:
        """Fill ``out`` (of this shape and dtype) with the rows."""


#: Stores a column's filled rows (its name, and a view of them: no copy) and returns what the state keeps instead.
ColumnWriter = Callable[[str, np.ndarray], Any]
#: Given what a :data:`ColumnWriter` returned, the rows it stored.
ColumnReader = Callable[[Any], ColumnSource]


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    # A helper rather than an inline isinstance: narrowing to numbers.Real would leave a value
    # that mypy cannot compare or pass to NumPy (the numbers ABCs declare no usable operators).
    return isinstance(value, numbers.Real)


def _check_capacity(capacity: Any) -> int:
    if not _is_int(capacity) or capacity < 1:
        raise ReplayBufferError(f"capacity must be an integer >= 1, got {capacity!r}")
    return int(capacity)


def _check_alpha(alpha: Any) -> float:
    if not _is_real(alpha) or not np.isfinite(alpha) or alpha < 0:
        raise ReplayBufferError(f"prioritized_replay_alpha must be a finite number >= 0, got {alpha!r}")
    return float(alpha)


def _check_beta(beta: Any) -> float:
    if not _is_real(beta) or not 0 <= beta <= 1:
        raise ReplayBufferError(f"prioritized_replay_beta must be in [0, 1], got {beta!r}")
    return float(beta)


def _column_array(value: Any) -> np.ndarray:
    return decompress_array(value) if isinstance(value, CompressedColumn) else np.asarray(value)


class ReplayBuffer:
    """A ring of the last ``capacity`` rows, sampled uniformly with replacement.

    Columns are allocated on the first :meth:`add` from that batch's dtypes and row shapes;
    every later batch must have the same columns and row shapes. Compressed columns are
    decompressed on the way in (the caller's batch is left as it was).
    """

    def __init__(self, capacity: int, seed: Seed = None) -> None:
        self.capacity = _check_capacity(capacity)
        self._rng = np.random.default_rng(seed)
        self._storage: dict[str, np.ndarray] | None = None
        self._next_idx = 0
        self._size = 0
        self._num_added = 0
        self._num_sampled = 0

    # -- adding ------------------------------------------------------------------------

    def add(self, batch: SampleBatch | Mapping[str, Any]) -> np.ndarray:
        """Append ``batch``'s rows, overwriting the oldest once full.

        A batch longer than the capacity keeps only its last ``capacity`` rows (the result of
        adding its rows one by one). Returns the positions written, in row order.
        """
        if isinstance(batch, MultiAgentBatch):
            raise ReplayBufferError(
                "a ReplayBuffer stores one policy's SampleBatch; use LocalReplayBuffer for a MultiAgentBatch"
            )
        columns = {key: _column_array(value) for key, value in batch.items()}
        lengths = {key: len(value) for key, value in columns.items()}
        if len(set(lengths.values())) > 1:
            raise ReplayBufferError(f"batch columns have different numbers of rows: {lengths}")
        count = next(iter(lengths.values()), 0)
        if count == 0:
            return np.empty(0, dtype=np.int64)
        if self._storage is None:
            self._allocate(columns)
        else:
            self._check_columns(columns)
        assert self._storage is not None

        kept = min(count, self.capacity)
        start = (self._next_idx + count - kept) % self.capacity
        first = min(kept, self.capacity - start)  # rows before the ring wraps
        for key, array in columns.items():
            column = self._storage[key]
            rows = array[count - kept :]
            column[start : start + first] = rows[:first]
            column[: kept - first] = rows[first:]
        self._next_idx = (self._next_idx + count) % self.capacity
        self._size = min(self._size + count, self.capacity)
        self._num_added += count
        return (start + np.arange(kept, dtype=np.int64)) % self.capacity

    def _allocate(self, columns: Mapping[str, np.ndarray | ColumnSource]) -> dict[str, np.ndarray]:
        self._storage = {
            key: np.zeros((self.capacity, *array.shape[1:]), dtype=array.dtype) for key, array in columns.items()
        }
        return self._storage

    def _check_columns(self, columns: Mapping[str, np.ndarray]) -> None:
        assert self._storage is not None
        if set(columns) != set(self._storage):
            missing = sorted(set(self._storage) - set(columns))
            extra = sorted(set(columns) - set(self._storage))
            raise ReplayBufferError(
                f"batch columns {sorted(columns)} differ from the buffer's {sorted(self._storage)} "
                f"(missing: {missing}, unexpected: {extra}); every batch added to a buffer needs the same columns"
            )
        for key, array in columns.items():
            stored = self._storage[key]
            if array.shape[1:] != stored.shape[1:]:
                raise ReplayBufferError(
                    f"column {key!r} has rows of shape {array.shape[1:]} but the buffer stores {stored.shape[1:]}"
                )
            if not np.can_cast(array.dtype, stored.dtype, casting="same_kind"):
                raise ReplayBufferError(
                    f"column {key!r} has dtype {array.dtype} which cannot be stored as the buffer's {stored.dtype}"
                )

    # -- sampling ----------------------------------------------------------------------

    def sample(self, num_items: int) -> SampleBatch:
        """``num_items`` rows drawn uniformly with replacement, plus a ``batch_indexes`` column."""
        self._check_can_sample(num_items)
        idxes = self._rng.integers(0, self._size, size=num_items, dtype=np.int64)
        return self._gather(idxes)

    def _check_can_sample(self, num_items: int) -> None:
        if not _is_int(num_items) or num_items < 0:
            raise ReplayBufferError(f"num_items must be an integer >= 0, got {num_items!r}")
        if self._size == 0:
            raise ReplayBufferError("cannot sample from an empty replay buffer; add a batch first")

    def _gather(self, idxes: np.ndarray) -> SampleBatch:
        assert self._storage is not None
        self._num_sampled += len(idxes)
        out = SampleBatch({key: column[idxes] for key, column in self._storage.items()})
        out[BATCH_INDEXES] = idxes
        return out

    # -- introspection -----------------------------------------------------------------

    def __len__(self) -> int:
        return self._size

    @property
    def num_added(self) -> int:
        """Rows ever added, including those since overwritten or dropped from oversize batches."""
        return self._num_added

    @property
    def columns(self) -> list[str]:
        """The stored column names (empty before the first add)."""
        return list(self._storage or ())

    def stats(self) -> dict[str, Any]:
        """Counts and memory use, for results and debugging."""
        row_bytes = sum(column[:1].nbytes for column in (self._storage or {}).values())
        return {
            "capacity": self.capacity,
            "num_entries": self._size,
            "num_added": self._num_added,
            "num_sampled": self._num_sampled,
            "est_size_bytes": row_bytes * self._size,
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._size}/{self.capacity} rows, columns={self.columns})"

    # -- state -------------------------------------------------------------------------

    def get_state(self, include_contents: bool = False, write_column: ColumnWriter | None = None) -> dict[str, Any]:
        """Counters and RNG state, and with ``include_contents`` the stored rows: copied, or with
        ``write_column`` what it returns for each column's rows (which it stores; see the module docstring)."""
        state: dict[str, Any] = {
            "capacity": self.capacity,
            "num_added": self._num_added,
            "num_sampled": self._num_sampled,
            "rng": self._rng.bit_generator.state,
            "contents": None,
        }
        if include_contents and self._storage is not None:
            state["contents"] = {
                "next_idx": self._next_idx,
                "size": self._size,
                # Rows [0, size) are exactly the filled slots, so positions survive the round trip.
                "columns": {
                    key: column[: self._size].copy()
                    if write_column is None
                    else write_column(key, column[: self._size])
                    for key, column in self._storage.items()
                },
            }
        return state

    def set_state(self, state: Mapping[str, Any], read_column: ColumnReader | None = None) -> None:
        """Restore :meth:`get_state`'s result. Without contents the buffer is left empty. Columns a
        ``write_column`` stored are read back with ``read_column`` straight into the new columns."""
        contents = state.get("contents")
        if contents is not None and state["capacity"] != self.capacity:
            raise ReplayBufferError(
                f"cannot restore a replay buffer of capacity {state['capacity']} with its contents "
                f"into one of capacity {self.capacity}"
            )
        self._num_added = int(state["num_added"])
        self._num_sampled = int(state["num_sampled"])
        self._rng = np.random.default_rng()
        self._rng.bit_generator.state = state["rng"]
        self._storage, self._next_idx, self._size = None, 0, 0
        if contents is not None and int(contents["size"]) > 0:
            size = int(contents["size"])
            columns = {key: self._column_source(key, value, read_column) for key, value in contents["columns"].items()}
            for key, source in columns.items():
                if source.shape[:1] != (size,):
                    raise ReplayBufferError(
                        f"column {key!r} of the state holds {source.shape[:1]} rows, its size says {size}"
                    )
            # Through the returned dict: mypy still holds self._storage as the None assigned above.
            storage = self._allocate(columns)
            for key, source in columns.items():
                if isinstance(source, np.ndarray):
                    storage[key][:size] = source
                else:
                    source.read_into(storage[key][:size])
            self._size = size
            self._next_idx = int(contents["next_idx"])

    @staticmethod
    def _column_source(key: str, value: Any, read_column: ColumnReader | None) -> np.ndarray | ColumnSource:
        if isinstance(value, np.ndarray):
            return value
        if read_column is None:
            raise ReplayBufferError(
                f"column {key!r} of the state is stored outside it ({value!r}): restore it with a read_column "
                "(a checkpoint's, as Trainer.restore does)"
            )
        return read_column(value)


class PrioritizedReplayBuffer(ReplayBuffer):
    """A ring buffer sampled in proportion to ``priority**alpha``, with importance weights.

    New rows get the largest priority seen so far (1.0 at first), so each is likely to be
    replayed at least once before its TD error is known. ``alpha=0`` samples uniformly.
    Rows whose priority is 0 (with ``alpha > 0``) are never sampled.
    """

    def __init__(self, capacity: int, alpha: float, seed: Seed = None) -> None:
        super().__init__(capacity, seed)
        self.alpha = _check_alpha(alpha)
        self._max_priority = 1.0
        self._reset_priorities()

    def _reset_priorities(self) -> None:
        self._priorities = np.zeros(self.capacity, dtype=np.float64)  # raw, before **alpha
        self._sum_tree = SumSegmentTree(self.capacity)
        self._min_tree = MinSegmentTree(self.capacity)

    def _set_tree_priorities(self, idxes: np.ndarray, priorities: np.ndarray) -> None:
        with np.errstate(over="ignore"):  # reported below with the offending priority
            scaled = priorities**self.alpha
        if not np.isfinite(scaled).all():
            pos = int(np.flatnonzero(~np.isfinite(scaled))[0])
            raise ReplayBufferError(
                f"priority {float(priorities[pos])!r} for index {int(idxes[pos])} overflows to inf "
                f"when raised to alpha={self.alpha}"
            )
        self._priorities[idxes] = priorities
        self._sum_tree[idxes] = scaled
        # The min tree spans only rows that can be drawn, so one zero priority does not make
        # the largest weight infinite and every weight zero.
        self._min_tree[idxes] = np.where(scaled > 0, scaled, np.inf)

    def add(self, batch: SampleBatch | Mapping[str, Any], priorities: np.ndarray | None = None) -> np.ndarray:
        """Append ``batch``'s rows with the max priority so far, or with ``priorities`` (one per row)."""
        if priorities is not None:
            priorities = np.asarray(priorities, dtype=np.float64).ravel()
            count = len(next(iter(batch.values()), ()))
            if len(priorities) != count:
                raise ReplayBufferError(f"got {len(priorities)} priorities for a batch of {count} rows")
            self._check_priorities(np.arange(count), priorities)
        idxes = super().add(batch)
        if len(idxes) == 0:
            return idxes
        if priorities is None:
            new = np.full(len(idxes), self._max_priority)
        else:
            new = priorities[len(priorities) - len(idxes) :]
            self._max_priority = max(self._max_priority, float(new.max()))
        self._set_tree_priorities(idxes, new)
        return idxes

    def sample(self, num_items: int, beta: float) -> SampleBatch:  # type: ignore[override]
        """``num_items`` rows drawn in proportion to ``priority**alpha``.

        Adds ``batch_indexes`` and ``weights`` (float32): ``(N * P(i))**-beta`` divided by the
        largest such weight over the whole buffer, so weights lie in ``(0, 1]``. Rows come in
        buffer order (one per stratum of the priority mass).
        """
        self._check_can_sample(num_items)
        beta = _check_beta(beta)
        total = self._sum_tree.total()
        if not total > 0:
            raise ReplayBufferError("cannot sample: every stored row has priority 0")
        segment = total / max(num_items, 1)
        prefix_sums = (np.arange(num_items) + self._rng.random(num_items)) * segment
        idxes = self._sum_tree.find_prefixsum_idx(prefix_sums)
        # (N P(i))^-beta / (N P_min)^-beta == (P_min / P(i))^beta: same value, no overflow.
        weights = (self._min_tree.min() / self._sum_tree[idxes]) ** beta
        out = self._gather(idxes)
        out[SampleBatch.WEIGHTS] = weights.astype(np.float32)
        return out

    def _check_priorities(self, idxes: np.ndarray, priorities: np.ndarray) -> None:
        bad = ~np.isfinite(priorities) | (priorities < 0)
        if bad.any():
            pos = int(np.flatnonzero(bad)[0])
            raise ReplayBufferError(
                f"priority {float(priorities[pos])!r} for index {int(idxes[pos])} "
                f"(position {pos} of {len(priorities)}) is invalid: priorities must be finite and >= 0"
            )

    def update_priorities(self, idxes: np.ndarray, priorities: np.ndarray) -> None:
        """Set the priorities of rows ``idxes`` (``batch_indexes`` of a sample); the last of repeats wins."""
        idxes = np.asarray(idxes).ravel()
        priorities = np.asarray(priorities, dtype=np.float64).ravel()
        if len(idxes) != len(priorities):
            raise ReplayBufferError(f"got {len(idxes)} indexes but {len(priorities)} priorities")
        if len(idxes) == 0:
            return
        if idxes.dtype.kind not in "iu":
            raise ReplayBufferError(f"indexes must be integers, got dtype {idxes.dtype}")
        out_of_range = (idxes < 0) | (idxes >= self._size)
        if out_of_range.any():
            pos = int(np.flatnonzero(out_of_range)[0])
            raise ReplayBufferError(
                f"index {int(idxes[pos])} (position {pos}) is not a stored row; the buffer holds rows [0, {self._size})"
            )
        self._check_priorities(idxes, priorities)
        self._set_tree_priorities(idxes.astype(np.int64), priorities)
        self._max_priority = max(self._max_priority, float(priorities.max()))

    @property
    def max_priority(self) -> float:
        """The largest priority seen so far (given to new rows)."""
        return self._max_priority

    def priorities(self) -> np.ndarray:
        """A copy of the stored rows' priorities (before ``**alpha``), by position."""
        priorities: np.ndarray = self._priorities[: self._size].copy()
        return priorities

    def stats(self) -> dict[str, Any]:
        stats = super().stats()
        stats["max_priority"] = self._max_priority
        return stats

    def get_state(self, include_contents: bool = False, write_column: ColumnWriter | None = None) -> dict[str, Any]:
        state = super().get_state(include_contents, write_column)
        state["alpha"] = self.alpha
        state["max_priority"] = self._max_priority
        if state["contents"] is not None:
            # Raw priorities rebuild both trees exactly (inner nodes are pure functions of the leaves).
            state["contents"]["priorities"] = self._priorities[: self._size].copy()
        return state

    def set_state(self, state: Mapping[str, Any], read_column: ColumnReader | None = None) -> None:
        super().set_state(state, read_column)
        # A uniform buffer's state (no priorities) restores with every row at the max priority.
        self._max_priority = float(state.get("max_priority", 1.0))
        self._reset_priorities()
        contents = state.get("contents")
        if contents is not None and self._size > 0:
            raw = contents.get("priorities")
            priorities = np.full(self._size, self._max_priority) if raw is None else np.asarray(raw, dtype=np.float64)
            self._set_tree_priorities(np.arange(self._size), priorities)


class LocalReplayBuffer:
    """Replay for execution plans: one buffer per policy id, gated by ``learning_starts``.

    ``add_batch`` takes a ``SampleBatch`` (the default policy) or a ``MultiAgentBatch`` and
    counts its env steps. ``replay()`` returns ``None`` until ``learning_starts`` env steps have
    been added, then ``replay_batch_size`` rows per policy: a ``SampleBatch`` when only the
    default policy has data, else a ``MultiAgentBatch``. With ``prioritized=True`` (the
    default) samples carry ``weights`` and ``batch_indexes``, and ``update_priorities`` sets
    each row's priority to ``|td_error| + prioritized_replay_eps``; with ``prioritized=False``
    sampling is uniform and ``update_priorities`` does nothing. ``beta`` may be reassigned
    between calls to anneal it.

    With ``replay_sequence_length`` > 1 (R2D2) an item is a sequence, not a row: ``add_batch`` takes
    batches cut into sequences (a recurrent policy's) and stores windows of at most that many steps,
    one starting at each of the batch's sequences (see :mod:`flowrl.data.sequence_replay`), and
    ``replay()`` returns ``replay_batch_size`` of them as a batch cut into sequences, each with its
    ``state_in_*``, and its index and weight on every one of its rows.
    """

    def __init__(
        self,
        capacity: int,
        learning_starts: int,
        replay_batch_size: int,
        prioritized_replay_alpha: float = 0.6,
        prioritized_replay_beta: float = 0.4,
        prioritized_replay_eps: float = 1e-6,
        prioritized: bool = True,
        seed: int | None = None,
        replay_sequence_length: int = 1,
    ) -> None:
        problems = []
        for check, value in (
            (_check_capacity, capacity),
            (_check_alpha, prioritized_replay_alpha),
            (_check_beta, prioritized_replay_beta),
        ):
            try:
                check(value)
            except ReplayBufferError as err:
                problems.append(str(err))
        if not _is_int(learning_starts) or learning_starts < 0:
            problems.append(f"learning_starts must be an integer >= 0, got {learning_starts!r}")
        if not _is_int(replay_batch_size) or replay_batch_size < 1:
            problems.append(f"replay_batch_size must be an integer >= 1, got {replay_batch_size!r}")
        if not _is_int(replay_sequence_length) or replay_sequence_length < 1:
            problems.append(f"replay_sequence_length must be an integer >= 1, got {replay_sequence_length!r}")
        eps = prioritized_replay_eps
        if not _is_real(eps) or not np.isfinite(eps) or eps <= 0:
            problems.append(f"prioritized_replay_eps must be a finite number > 0, got {eps!r}")
        if problems:
            raise ReplayBufferError("invalid LocalReplayBuffer arguments: " + "; ".join(problems))

        self.capacity = int(capacity)
        self.learning_starts = int(learning_starts)
        self.replay_batch_size = int(replay_batch_size)
        self.alpha = float(prioritized_replay_alpha)
        self._beta = float(prioritized_replay_beta)
        self.eps = float(eps)
        self.prioritized = bool(prioritized)
        self.seed = seed
        self.replay_sequence_length = int(replay_sequence_length)
        self._buffers: dict[str, ReplayBuffer] = {}
        self._num_steps_added = 0
        self._num_steps_replayed = 0

    @property
    def beta(self) -> float:
        """Importance-sampling exponent used by the next ``replay()``, in [0, 1]."""
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        self._beta = _check_beta(value)

    @property
    def num_steps_added(self) -> int:
        """Env steps added so far (what ``learning_starts`` is compared with)."""
        return self._num_steps_added

    @property
    def buffers(self) -> dict[str, ReplayBuffer]:
        """The underlying buffer of each policy id seen so far."""
        return dict(self._buffers)

    def _buffer(self, policy_id: str) -> ReplayBuffer:
        buffer = self._buffers.get(policy_id)
        if buffer is None:
            # A seed per policy that depends only on (seed, policy id), not on arrival order.
            seed = None if self.seed is None else np.random.SeedSequence([self.seed, zlib.crc32(policy_id.encode())])
            if self.prioritized:
                buffer = PrioritizedReplayBuffer(self.capacity, self.alpha, seed=seed)
            else:
                buffer = ReplayBuffer(self.capacity, seed=seed)
            self._buffers[policy_id] = buffer
        return buffer

    def add_batch(self, batch: SampleBatch | MultiAgentBatch) -> None:
        """Store each policy's rows in that policy's buffer and count the batch's env steps.

        A policy's rows that carry a ``td_error`` column (worker-side priorities) get the priorities
        ``|td_error| + prioritized_replay_eps`` instead of the max priority; the column is not stored.
        """
        if not isinstance(batch, (SampleBatch, MultiAgentBatch)):
            raise ReplayBufferError(f"add_batch takes a SampleBatch or MultiAgentBatch, got {type(batch).__name__}")
        for policy_id, policy_batch in as_policy_batches(batch).items():
            buffer = self._buffer(policy_id)
            if SampleBatch.TD_ERROR not in policy_batch:
                buffer.add(self._items(policy_batch))
                continue
            td_error = np.abs(np.asarray(policy_batch[SampleBatch.TD_ERROR], dtype=np.float64))
            rows = self._items(SampleBatch({k: v for k, v in policy_batch.items() if k != SampleBatch.TD_ERROR}))
            if isinstance(buffer, PrioritizedReplayBuffer) and self.replay_sequence_length == 1:
                buffer.add(rows, td_error + self.eps)
            else:  # uniform replay has no priorities; a sequence's would be its steps' mixture (R2D2's loss)
                buffer.add(rows)
        self._num_steps_added += batch.env_steps()

    def _items(self, batch: SampleBatch) -> SampleBatch | dict[str, np.ndarray]:
        """What the buffer stores of ``batch``: its rows, or its windows of sequences."""
        length = self.replay_sequence_length
        if length == 1:
            return batch
        if SampleBatch.SEQ_LENS not in batch:
            raise ReplayBufferError(
                f"replay_sequence_length={length} stores sequences: add_batch takes a batch cut into "
                f"sequences (a recurrent policy's, with seq_lens), got one with columns {sorted(batch)}"
            )
        # A new dict of the same arrays: decompressing it leaves the caller's batch as it was.
        return to_items(sequence_windows(SampleBatch(dict(batch)).decompress_if_needed(), length), length)

    def replay(self) -> SampleBatch | MultiAgentBatch | None:
        """``replay_batch_size`` rows per policy, or ``None`` before ``learning_starts`` or with nothing stored."""
        if self._num_steps_added < self.learning_starts:
            return None
        samples: dict[str, SampleBatch] = {}
        for policy_id, buffer in self._buffers.items():
            if len(buffer) == 0:
                continue
            if isinstance(buffer, PrioritizedReplayBuffer):
                sample = buffer.sample(self.replay_batch_size, beta=self._beta)
            else:
                sample = buffer.sample(self.replay_batch_size)
            samples[policy_id] = sample if self.replay_sequence_length == 1 else from_items(sample)
        if not samples:
            return None
        self._num_steps_replayed += self.replay_batch_size
        return MultiAgentBatch.wrap_as_needed(samples, self.replay_batch_size)

    def update_priorities(self, prio_dict: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> None:
        """Set priorities to ``|td_error| + eps`` from ``{policy_id: (batch_indexes, td_errors)}``."""
        if not self.prioritized:
            return
        for policy_id, (idxes, td_errors) in prio_dict.items():
            buffer = self._buffers.get(policy_id)
            if buffer is None:
                raise ReplayBufferError(
                    f"update_priorities got unknown policy id {policy_id!r}; known: {sorted(self._buffers)}"
                )
            assert isinstance(buffer, PrioritizedReplayBuffer)
            buffer.update_priorities(idxes, np.abs(np.asarray(td_errors, dtype=np.float64)) + self.eps)

    def stats(self) -> dict[str, Any]:
        """Env steps added and replayed, ``beta``, and each policy buffer's stats."""
        return {
            "num_steps_added": self._num_steps_added,
            "num_steps_replayed": self._num_steps_replayed,
            "beta": self._beta,
            "policies": {policy_id: buffer.stats() for policy_id, buffer in self._buffers.items()},
        }

    def get_state(self, include_contents: bool = False, write_column: ColumnWriter | None = None) -> dict[str, Any]:
        """Counters, ``beta`` and every policy buffer's state (rows only with ``include_contents``; given to
        ``write_column`` as ``"<policy id>/<column>"`` if given, see :meth:`ReplayBuffer.get_state`)."""
        return {
            "num_steps_added": self._num_steps_added,
            "num_steps_replayed": self._num_steps_replayed,
            "beta": self._beta,
            "buffers": {
                pid: buffer.get_state(include_contents, _prefixed(write_column, pid))
                for pid, buffer in self._buffers.items()
            },
        }

    @staticmethod
    def state_holds_rows(state: Mapping[str, Any] | None) -> bool:
        """Whether :meth:`get_state`'s result ``state`` holds stored rows (None, as a checkpoint gives
        a shard that was dead when saved, holds none)."""
        return state is not None and any(
            (buffer.get("contents") or {}).get("size", 0) > 0 for buffer in state["buffers"].values()
        )

    def set_state(self, state: Mapping[str, Any], read_column: ColumnReader | None = None) -> None:
        """Restore :meth:`get_state`'s result (buffers are rebuilt with this object's settings; stored
        columns are read with ``read_column``)."""
        self._num_steps_added = int(state["num_steps_added"])
        self._num_steps_replayed = int(state["num_steps_replayed"])
        self.beta = state["beta"]
        self._buffers = {}  # the old rows are freed before the new ones are allocated
        for policy_id, buffer_state in state["buffers"].items():
            self._buffer(policy_id).set_state(buffer_state, read_column)

    def __repr__(self) -> str:
        sizes = ", ".join(f"{pid}: {len(b)}" for pid, b in self._buffers.items())
        return (
            f"LocalReplayBuffer(capacity={self.capacity}, prioritized={self.prioritized}, "
            f"steps_added={self._num_steps_added}, {{{sizes}}})"
        )


def _prefixed(write_column: ColumnWriter | None, policy_id: str) -> ColumnWriter | None:
    if write_column is None:
        return None
    return lambda key, rows: write_column(f"{policy_id}/{key}", rows)
