"""Replay of fixed-length sequences (R2D2): overlapping windows stored as one item each.

A recurrent policy's sampler cuts its fragments into sequences (see :mod:`flowrl.data.sequences`),
each with the state it started from (``state_in_*``). :func:`sequence_windows` joins consecutive
sequences of the same episode into windows of at most ``length`` steps, one starting at every
sequence: a sampler that cuts at ``length // 2`` gives windows that overlap by half, as R2D2's
replay does. A window never spans two episodes, nor a gap between two sampled pieces.

A replay buffer stores rows of fixed shape, so :func:`to_items` pads each window to ``length``
steps: one item holds every column's ``[length, ...]`` steps, the window's state and its length.
:func:`from_items` turns sampled items back into a batch cut into sequences (rows in sequence
order, ``seq_lens``, ``state_in_*``), the layout a recurrent loss reads; an item's per-item
columns (``batch_indexes``, ``weights``) are repeated on each of its rows.
"""

from __future__ import annotations

import numpy as np

from flowrl.data.sample_batch import SampleBatch

#: The column of an item that holds its window's length (not ``seq_lens``: an item is one row of a buffer).
ITEM_LENGTH = "item_length"


def sequence_windows(batch: SampleBatch, length: int) -> SampleBatch:
    """Windows of at most ``length`` steps over ``batch`` (cut into sequences, with ``eps_id`` and ``t``):
    one per sequence, made of it and the sequences that continue its episode without a gap while they
    fit; a window that would end where the previous one ends is left out (its steps are in that one)."""
    if length < 1:
        raise ValueError(f"length={length} must be >= 1")
    seq_lens = np.asarray(batch[SampleBatch.SEQ_LENS], dtype=np.int64)
    bounds = batch.sequence_bounds()
    starts, ends = bounds[:-1], bounds[1:]
    eps_id, t = batch[SampleBatch.EPS_ID], batch[SampleBatch.T]
    # Sequence k + 1 continues sequence k: same episode, and its first step follows k's last.
    follows = (eps_id[starts[1:]] == eps_id[ends[:-1] - 1]) & (t[starts[1:]] == t[ends[:-1] - 1] + 1)
    windows: list[tuple[int, int]] = []  # (first sequence, row after the window's last)
    for k in range(len(seq_lens)):
        end, last = int(ends[k]), k
        while last + 1 < len(seq_lens) and follows[last] and int(ends[last + 1] - starts[k]) <= length:
            last += 1
            end = int(ends[last])
        if windows and windows[-1][1] == end:
            continue
        windows.append((k, end))
    rows = np.concatenate([np.arange(starts[k], end) for k, end in windows]) if windows else np.empty(0, np.int64)
    firsts = np.array([k for k, _ in windows], dtype=np.int64)
    columns = {
        key: value[firsts] if batch.is_sequence_column(key) else value[rows]
        for key, value in batch.items()
        if key != SampleBatch.SEQ_LENS
    }
    columns[SampleBatch.SEQ_LENS] = np.array([end - starts[k] for k, end in windows], dtype=np.int32)
    return SampleBatch(columns)


def to_items(batch: SampleBatch, length: int) -> dict[str, np.ndarray]:
    """``batch``'s sequences (each at most ``length`` steps) as items: every column of rows as
    ``[num_sequences, length, ...]`` (zeros after a sequence's end), ``state_in_*`` as they are,
    and the lengths as :data:`ITEM_LENGTH`."""
    seq_lens = np.asarray(batch[SampleBatch.SEQ_LENS], dtype=np.int64)
    if len(seq_lens) and seq_lens.max() > length:
        raise ValueError(f"a sequence of {int(seq_lens.max())} steps does not fit in items of length {length}")
    starts = batch.sequence_bounds()[:-1]
    # Each row's place in the flattened [num_sequences * length] layout.
    place = np.repeat(np.arange(len(seq_lens)) * length - starts, seq_lens) + np.arange(batch.count)
    items: dict[str, np.ndarray] = {ITEM_LENGTH: seq_lens.astype(np.int32)}
    for key, value in batch.items():
        if key == SampleBatch.SEQ_LENS:
            continue
        if batch.is_sequence_column(key):
            items[key] = value
            continue
        padded = np.zeros((len(seq_lens) * length, *value.shape[1:]), dtype=value.dtype)
        padded[place] = value
        items[key] = padded.reshape(len(seq_lens), length, *value.shape[1:])
    return items


def from_items(items: SampleBatch) -> SampleBatch:
    """Sampled items back as a batch cut into sequences: the real steps of each item's ``[length, ...]``
    columns as rows, ``seq_lens`` and ``state_in_*`` one per item, and the other per-item columns
    (``batch_indexes``, ``weights``: one value per item) repeated on each of its rows."""
    lengths = np.asarray(items[ITEM_LENGTH], dtype=np.int64)
    columns: dict[str, np.ndarray] = {SampleBatch.SEQ_LENS: lengths.astype(np.int32)}
    for key, value in items.items():
        if key == ITEM_LENGTH:
            continue
        if key.startswith(SampleBatch.STATE_IN):
            columns[key] = value
        elif value.ndim >= 2:  # [n, length, ...]: steps
            real = np.arange(value.shape[1])[None, :] < lengths[:, None]
            columns[key] = value[real]
        else:  # one value per item
            columns[key] = np.repeat(value, lengths)
    return SampleBatch(columns)
