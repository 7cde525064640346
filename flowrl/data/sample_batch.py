"""Batches of experience: columns of NumPy arrays, one row per step.

A :class:`SampleBatch` is a ``dict`` from column name to array (all with the same first
dimension, but for the sequence columns of a recurrent policy's batch: see below), so it pickles
cheaply through Ray's object store. A
:class:`MultiAgentBatch` maps policy ids to sample batches and counts environment steps
separately from agent steps.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping, Sequence, overload

import numpy as np

from flowrl.data.compression import CompressedColumn, compress_array, decompress_array

#: The policy id of single-agent training: the one policy a plain ``SampleBatch`` belongs to.
DEFAULT_POLICY_ID = "default_policy"


class SampleBatch(dict[str, Any]):
    """Columns of experience with a common number of rows (``count``).

    Values given as lists are converted to arrays. Columns can be LZ4-compressed in place
    with :meth:`compress` and restored with :meth:`decompress_if_needed`.

    A batch of a recurrent policy is cut into sequences (RLlib's convention): ``seq_lens`` holds
    each sequence's length (they sum to ``count``; its rows are consecutive) and ``state_in_0``,
    ``state_in_1``, ... the recurrent state at each sequence's first step, one row per sequence.
    Such a batch slices only at sequence boundaries and shuffles whole sequences.
    """

    OBS = "obs"
    NEW_OBS = "new_obs"
    ACTIONS = "actions"
    REWARDS = "rewards"
    TERMINATEDS = "terminateds"
    TRUNCATEDS = "truncateds"
    EPS_ID = "eps_id"
    T = "t"
    ENV_ID = "env_id"
    AGENT_INDEX = "agent_index"
    #: In experience files of multi-agent envs: the policy that acted for the row, and the agent it acted as.
    POLICY_ID = "policy_id"
    AGENT_ID = "agent_id"
    ACTION_LOGP = "action_logp"
    ACTION_DIST_INPUTS = "action_dist_inputs"
    VF_PREDS = "vf_preds"
    ADVANTAGES = "advantages"
    VALUE_TARGETS = "value_targets"
    WEIGHTS = "weights"
    #: Each row's TD error, computed where it was sampled (``worker_side_prioritization``): a prioritized
    #: replay buffer stores the row with the priority ``|td_error| + eps``, not the column.
    TD_ERROR = "td_error"
    #: Legal actions of the row's observation (``[B, n]`` bools), for envs that mask actions.
    ACTION_MASK = "action_mask"
    #: Legal actions of the row's ``new_obs``: the TD targets' max and argmax range over them.
    NEXT_ACTION_MASK = "next_action_mask"
    #: The previous action and reward of each row (zeros at an episode's first step), for recurrent models.
    PREV_ACTIONS = "prev_actions"
    PREV_REWARDS = "prev_rewards"
    #: Lengths of the sequences of a recurrent policy's batch (one row per sequence).
    SEQ_LENS = "seq_lens"
    #: Prefix of the recurrent state columns: ``state_in_<k>`` (the state acted from) and ``state_out_<k>``.
    STATE_IN = "state_in_"
    STATE_OUT = "state_out_"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for key, value in list(self.items()):
            if not isinstance(value, (np.ndarray, CompressedColumn)):
                super().__setitem__(key, np.asarray(value))
        self._check_lengths()

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from all its columns at once: pickle's default sets them one by one, in an order where
        # state_in_* may come before seq_lens says it has one row per sequence.
        return (self.__class__, (dict(self),))

    def __setitem__(self, key: str, value: Any) -> None:
        if not isinstance(value, (np.ndarray, CompressedColumn)):
            value = np.asarray(value)
        if self.is_sequence_column(key):
            super().__setitem__(key, value)
            self._check_lengths()
            return
        # Only a column of rows can disagree; any() stops at the first (usually the batch's first key).
        if len(value) != self.count and any(k != key and not self.is_sequence_column(k) for k in self):
            raise ValueError(f"column {key!r} has {len(value)} rows but the SampleBatch has {self.count}")
        super().__setitem__(key, value)

    def is_sequence_column(self, key: str) -> bool:
        """Whether ``key`` has one row per sequence (``seq_lens``, and ``state_in_*`` of a batch cut into sequences)."""
        return key == self.SEQ_LENS or (key.startswith(self.STATE_IN) and dict.__contains__(self, self.SEQ_LENS))

    def _check_lengths(self) -> None:
        lengths = {key: len(value) for key, value in self.items() if not self.is_sequence_column(key)}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"SampleBatch columns must have the same number of rows, got {lengths}")
        if self.SEQ_LENS not in self:
            return
        seq_lens = self[self.SEQ_LENS]
        per_sequence = {key: len(value) for key, value in self.items() if self.is_sequence_column(key)}
        if len(set(per_sequence.values())) > 1:
            raise ValueError(f"SampleBatch sequence columns must have one row per sequence, got {per_sequence}")
        # A compressed seq_lens (compress() was asked for it) was checked before it was compressed.
        if lengths and not isinstance(seq_lens, CompressedColumn) and int(np.sum(seq_lens)) != self.count:
            raise ValueError(f"seq_lens sum to {int(np.sum(seq_lens))} but the SampleBatch has {self.count} rows")

    @property
    def count(self) -> int:
        """The number of rows (steps)."""
        for key, value in self.items():
            if not self.is_sequence_column(key):
                return len(value)
        return 0

    def sequence_bounds(self) -> np.ndarray:
        """The row where each sequence starts, then ``count``: ``len(seq_lens) + 1`` values."""
        return np.concatenate([[0], np.cumsum(self[self.SEQ_LENS], dtype=np.int64)])

    def env_steps(self) -> int:
        """Environment steps in the batch (its rows)."""
        return self.count

    def agent_steps(self) -> int:
        """Agent steps in the batch (its rows: one agent)."""
        return self.count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, key: str | slice) -> Any:
        if isinstance(key, slice):
            if key.step not in (None, 1):
                raise ValueError(f"SampleBatch slices must be contiguous, got step {key.step}")
            start, stop, _ = key.indices(self.count)
            return self.slice(start, stop)
        return super().__getitem__(key)

    def copy(self) -> "SampleBatch":
        """A copy whose arrays are copied too."""
        return SampleBatch({k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in self.items()})

    def slice(self, start: int, end: int) -> "SampleBatch":
        """Rows ``start`` to ``end`` (exclusive); arrays are views, not copies.

        A batch cut into sequences slices at sequence boundaries only (else ValueError).
        """
        self._require_decompressed("slice")
        if self.SEQ_LENS not in self:
            return SampleBatch({k: v[start:end] for k, v in self.items()})
        bounds = self.sequence_bounds()
        first, last = np.searchsorted(bounds, [start, end])
        if first == len(bounds) or last == len(bounds) or bounds[first] != start or bounds[last] != end:
            raise ValueError(
                f"SampleBatch.slice({start}, {end}) cuts a sequence; sequences start at rows {bounds.tolist()}"
            )
        return SampleBatch(
            {k: (v[first:last] if self.is_sequence_column(k) else v[start:end]) for k, v in self.items()}
        )

    def rows(self) -> Iterator[dict[str, Any]]:
        """Iterate over the rows, each a dict from column to value (sequence columns left out)."""
        self._require_decompressed("rows")
        columns = {k: v for k, v in self.items() if not self.is_sequence_column(k)}
        for i in range(self.count):
            yield {k: v[i] for k, v in columns.items()}

    def shuffle(self, seed: int | np.random.Generator | None = None) -> "SampleBatch":
        """A copy with the rows in a random order (whole sequences, in a batch cut into them)."""
        self._require_decompressed("shuffle")
        rng = np.random.default_rng(seed)
        if self.SEQ_LENS not in self:
            perm = rng.permutation(self.count)
            return SampleBatch({k: v[perm] for k, v in self.items()})
        order = rng.permutation(len(self[self.SEQ_LENS]))
        bounds = self.sequence_bounds()
        rows = np.concatenate([np.arange(bounds[j], bounds[j + 1]) for j in order] or [np.zeros(0, np.int64)])
        return SampleBatch({k: (v[order] if self.is_sequence_column(k) else v[rows]) for k, v in self.items()})

    def split_by_episode(self) -> list["SampleBatch"]:
        """Split into runs of consecutive rows that share an ``eps_id``."""
        self._require_decompressed("split_by_episode")
        if self.EPS_ID not in self:
            raise KeyError(f"split_by_episode needs the '{self.EPS_ID}' column; columns are {sorted(self)}")
        eps = self[self.EPS_ID]
        if self.count == 0:
            return []
        bounds = [0, *(np.flatnonzero(eps[1:] != eps[:-1]) + 1).tolist(), self.count]
        return [self.slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]

    def timeslices(self, size: int) -> list["SampleBatch"]:
        """Consecutive chunks of ``size`` rows (the last may be shorter)."""
        if size < 1:
            raise ValueError(f"timeslices(size={size}): size must be >= 1")
        return [self.slice(i, min(i + size, self.count)) for i in range(0, self.count, size)]

    def size_bytes(self) -> int:
        """Bytes held by the columns (compressed columns count their compressed size)."""
        return sum(v.nbytes for v in self.values())

    # -- compression -----------------------------------------------------------------

    def compress(self, columns: Iterable[str] = (OBS, NEW_OBS)) -> "SampleBatch":
        """LZ4-compress the given columns in place (those present); returns ``self``."""
        for key in columns:
            value = self.get(key)
            if isinstance(value, np.ndarray):
                super().__setitem__(key, compress_array(value))
        return self

    def decompress_if_needed(self) -> "SampleBatch":
        """Decompress every compressed column in place; returns ``self``."""
        for key, value in list(self.items()):
            if isinstance(value, CompressedColumn):
                super().__setitem__(key, decompress_array(value))
        return self

    def is_compressed(self) -> bool:
        """Whether any column is compressed."""
        return any(isinstance(v, CompressedColumn) for v in self.values())

    def _require_decompressed(self, what: str) -> None:
        if self.is_compressed():
            raise ValueError(f"SampleBatch.{what}() needs decompressed columns; call decompress_if_needed() first")

    def __repr__(self) -> str:
        cols = ", ".join(f"{k}: {getattr(v, 'shape', '?')}" for k, v in self.items())
        return f"SampleBatch({self.count} rows: {cols})"


def as_policy_batches(batch: "SampleBatch | MultiAgentBatch") -> dict[str, SampleBatch]:
    """A batch as ``{policy_id: SampleBatch}``: a plain SampleBatch belongs to the default policy."""
    if isinstance(batch, MultiAgentBatch):
        return dict(batch.policy_batches)
    return {DEFAULT_POLICY_ID: batch}


@overload
def concat_samples(batches: Sequence[SampleBatch]) -> SampleBatch: ...
@overload
def concat_samples(batches: Sequence[SampleBatch | MultiAgentBatch]) -> SampleBatch | MultiAgentBatch: ...
def concat_samples(batches: Sequence[SampleBatch | MultiAgentBatch]) -> SampleBatch | MultiAgentBatch:
    """Concatenate batches row-wise (multi-agent batches policy by policy)."""
    batches = [b for b in batches if b.count > 0] or list(batches[:1])
    if not batches:
        return SampleBatch()
    if isinstance(batches[0], MultiAgentBatch):
        return MultiAgentBatch.concat_samples(batches)
    sample_batches: list[SampleBatch] = []
    for b in batches:
        if not isinstance(b, SampleBatch):
            raise ValueError(f"cannot concatenate a SampleBatch with {type(b).__name__}")
        sample_batches.append(b)
    keys = list(sample_batches[0].keys())
    for sb in sample_batches[1:]:
        if set(sb.keys()) != set(keys):
            raise ValueError(
                f"cannot concatenate batches with different columns: {sorted(keys)} vs {sorted(sb.keys())}"
            )

    def column(b: SampleBatch, key: str) -> np.ndarray:
        value = dict.__getitem__(b, key)
        return decompress_array(value) if isinstance(value, CompressedColumn) else value

    return SampleBatch({k: np.concatenate([column(b, k) for b in sample_batches]) for k in keys})


class MultiAgentBatch:
    """Sample batches keyed by policy id, with env steps counted apart from agent steps.

    ``env_steps`` is the number of environment steps the batch covers; each agent acting in
    a step adds one row to its policy's batch, so agent steps can exceed env steps.
    """

    def __init__(self, policy_batches: Mapping[str, SampleBatch], env_steps: int) -> None:
        self.policy_batches = dict(policy_batches)
        self._env_steps = int(env_steps)

    @property
    def count(self) -> int:
        """Environment steps (what sampling and training counters use)."""
        return self._env_steps

    def env_steps(self) -> int:
        """Environment steps covered by the batch."""
        return self._env_steps

    def agent_steps(self) -> int:
        """Rows over all policies."""
        return sum(b.count for b in self.policy_batches.values())

    @staticmethod
    def wrap_as_needed(policy_batches: Mapping[str, SampleBatch], env_steps: int) -> "SampleBatch | MultiAgentBatch":
        """A plain SampleBatch when only the default policy is present, else a MultiAgentBatch."""
        if set(policy_batches) == {DEFAULT_POLICY_ID}:
            return policy_batches[DEFAULT_POLICY_ID]
        return MultiAgentBatch(policy_batches, env_steps)

    @staticmethod
    def concat_samples(batches: Sequence["SampleBatch | MultiAgentBatch"]) -> "MultiAgentBatch":
        """Concatenate policy by policy; env steps add up. Raises ValueError unless all are MultiAgentBatches."""
        per_policy: dict[str, list[SampleBatch]] = {}
        for b in batches:
            if not isinstance(b, MultiAgentBatch):
                raise ValueError(f"cannot concatenate a MultiAgentBatch with {type(b).__name__}")
            for pid, sb in b.policy_batches.items():
                per_policy.setdefault(pid, []).append(sb)
        return MultiAgentBatch(
            {pid: concat_samples(sbs) for pid, sbs in per_policy.items()}, sum(b.env_steps() for b in batches)
        )

    def copy(self) -> "MultiAgentBatch":
        """A deep copy of every policy's batch."""
        return MultiAgentBatch({pid: b.copy() for pid, b in self.policy_batches.items()}, self._env_steps)

    def compress(self, columns: Iterable[str] = (SampleBatch.OBS, SampleBatch.NEW_OBS)) -> "MultiAgentBatch":
        """Compress the given columns of every policy's batch in place."""
        columns = tuple(columns)
        for b in self.policy_batches.values():
            b.compress(columns)
        return self

    def decompress_if_needed(self) -> "MultiAgentBatch":
        """Decompress every policy's batch in place."""
        for b in self.policy_batches.values():
            b.decompress_if_needed()
        return self

    def size_bytes(self) -> int:
        """Bytes held by all policies' columns."""
        return sum(b.size_bytes() for b in self.policy_batches.values())

    def __repr__(self) -> str:
        parts = ", ".join(f"{pid}: {b.count}" for pid, b in self.policy_batches.items())
        return f"MultiAgentBatch(env_steps={self._env_steps}, {{{parts}}})"
