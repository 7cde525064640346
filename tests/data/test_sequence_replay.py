"""Replay of sequences (R2D2): overlapping windows stored whole, each with the state it started from."""

from __future__ import annotations

import numpy as np
import pytest

from flowrl.data import LocalReplayBuffer, SampleBatch, concat_samples
from flowrl.data.replay_buffer import BATCH_INDEXES
from flowrl.data.sequence_replay import sequence_windows
from flowrl.data.sequences import chop_into_sequences
from flowrl.errors import ReplayBufferError

pytestmark = pytest.mark.unit


def episode(eps_id: int, steps: int, first_t: int = 0) -> SampleBatch:
    """One env's steps of one episode, with a recognisable state per step (its t, in both entries)."""
    t = np.arange(first_t, first_t + steps)
    return SampleBatch(
        {
            SampleBatch.OBS: np.stack([t, -t], axis=1).astype(np.float32),
            SampleBatch.ACTIONS: t % 2,
            SampleBatch.REWARDS: np.ones(steps, np.float32),
            SampleBatch.EPS_ID: np.full(steps, eps_id),
            SampleBatch.T: t,
            "state_in_0": np.repeat(t[:, None], 3, axis=1).astype(np.float32),
            "state_out_0": np.repeat(t[:, None] + 1, 3, axis=1).astype(np.float32),
        }
    )


def sampled(*pieces: SampleBatch, chunk: int) -> SampleBatch:
    """What a sampler of a recurrent policy returns: its pieces cut into sequences of ``chunk`` steps."""
    return concat_samples([chop_into_sequences(piece, chunk) for piece in pieces])


def test_windows_overlap_by_half_and_never_span_two_episodes_or_a_gap() -> None:
    batch = sampled(episode(1, 10), episode(2, 5), episode(1, 4, first_t=20), chunk=2)
    windows = sequence_windows(batch, 4)
    bounds = windows.sequence_bounds()
    spans = [
        (int(windows[SampleBatch.EPS_ID][a]), int(windows[SampleBatch.T][a]), int(b - a))
        for a, b in zip(bounds, bounds[1:])
    ]
    # Episode 1: windows start every 2 steps; the last 2 steps are inside the window before. Episode 2's
    # piece (5 steps) and episode 1's later piece (a gap after t=9) start windows of their own.
    assert spans == [(1, 0, 4), (1, 2, 4), (1, 4, 4), (1, 6, 4), (2, 0, 4), (2, 2, 3), (1, 20, 4)]
    for (eps, first_t, length), a in zip(spans, bounds):
        assert np.array_equal(windows[SampleBatch.T][a : a + length], np.arange(first_t, first_t + length))
    # Each window starts from the state its first step was acted from.
    assert np.array_equal(windows["state_in_0"][:, 0], [0, 2, 4, 6, 0, 2, 20])


def test_a_sequence_buffer_stores_and_replays_whole_sequences_with_their_state() -> None:
    buffer = LocalReplayBuffer(100, learning_starts=0, replay_batch_size=8, replay_sequence_length=4, seed=0)
    batch = sampled(episode(1, 10), episode(2, 5), chunk=2)
    buffer.add_batch(batch)
    assert buffer.num_steps_added == 15  # env steps, not the windows' rows
    assert len(buffer.buffers["default_policy"]) == 6  # sequences: one item each
    replayed = buffer.replay()
    assert replayed is not None and len(replayed[SampleBatch.SEQ_LENS]) == 8
    bounds = replayed.sequence_bounds()
    for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
        t = replayed[SampleBatch.T][a:b]
        assert np.array_equal(t, np.arange(t[0], t[0] + b - a)), "a replayed sequence is contiguous"
        assert len(set(replayed[SampleBatch.EPS_ID][a:b])) == 1
        assert np.array_equal(replayed[SampleBatch.OBS][a:b, 0], t)
        assert np.array_equal(replayed["state_in_0"][k], np.full(3, t[0]))
        # The sequence's index and weight are on each of its rows.
        assert len(set(replayed[BATCH_INDEXES][a:b])) == 1 and len(set(replayed["weights"][a:b])) == 1
    # One priority per sequence, given on each of its rows.
    priorities = np.repeat(np.arange(8, dtype=np.float64) + 1, replayed[SampleBatch.SEQ_LENS])
    buffer.update_priorities({"default_policy": (replayed[BATCH_INDEXES], priorities)})
    stored = buffer.buffers["default_policy"].priorities()
    first_rows = bounds[:-1]
    for index, priority in zip(replayed[BATCH_INDEXES][first_rows], priorities[first_rows]):
        # The last of repeated draws of a sequence wins.
        last = max(i for i, x in enumerate(replayed[BATCH_INDEXES][first_rows]) if x == index)
        assert stored[index] == pytest.approx(priorities[first_rows][last] + buffer.eps)


def test_a_sequence_buffer_refuses_a_batch_without_sequences() -> None:
    buffer = LocalReplayBuffer(100, learning_starts=0, replay_batch_size=2, replay_sequence_length=4)
    with pytest.raises(ReplayBufferError, match="replay_sequence_length=4 stores sequences"):
        buffer.add_batch(episode(1, 4))


def test_a_sequence_buffer_round_trips_its_contents_through_its_state() -> None:
    buffer = LocalReplayBuffer(100, learning_starts=0, replay_batch_size=4, replay_sequence_length=4, seed=1)
    buffer.add_batch(sampled(episode(1, 9), chunk=2))
    restored = LocalReplayBuffer(100, learning_starts=0, replay_batch_size=4, replay_sequence_length=4)
    restored.set_state(buffer.get_state(include_contents=True))
    a, b = buffer.replay(), restored.replay()
    assert a is not None and b is not None
    assert all(np.array_equal(a[key], b[key]) for key in a)
