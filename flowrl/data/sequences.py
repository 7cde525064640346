"""Cutting trajectory pieces into the sequences a recurrent policy learns from.

A recurrent policy's sampler records, for every row, the state the policy acted from
(``state_in_<k>``) and the state it moved to (``state_out_<k>``). :func:`chop_into_sequences` turns one
trajectory piece (consecutive steps of one env's episode) into sequences of at most ``max_seq_len``
rows: ``seq_lens`` gives their lengths and ``state_in_<k>`` keeps the state at each sequence's first
row only (see :class:`~flowrl.data.SampleBatch`).
"""

from __future__ import annotations

import numpy as np

from flowrl.data.sample_batch import SampleBatch


def chop_into_sequences(piece: SampleBatch, max_seq_len: int) -> SampleBatch:
    """``piece`` (one env's consecutive steps of one episode, with per-row ``state_in_*`` and
    ``state_out_*``) as sequences of ``max_seq_len`` rows (the last may be shorter)."""
    if max_seq_len < 1:
        raise ValueError(f"max_seq_len={max_seq_len} must be >= 1")
    count = piece.count
    starts = np.arange(0, count, max_seq_len)
    seq_lens = np.minimum(max_seq_len, count - starts).astype(np.int32)
    columns = {}
    for key, value in piece.items():
        if key.startswith(SampleBatch.STATE_OUT):
            continue
        columns[key] = value[starts] if key.startswith(SampleBatch.STATE_IN) else value
    columns[SampleBatch.SEQ_LENS] = seq_lens
    return SampleBatch(columns)
