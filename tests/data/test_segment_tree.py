"""Sum and min segment trees against brute-force NumPy on random data."""

from __future__ import annotations

import numpy as np
import pytest

from flowrl.data import MinSegmentTree, SumSegmentTree

pytestmark = pytest.mark.unit


def brute_prefixsum_idx(values: np.ndarray, s: float) -> int:
    """Smallest i with sum(values[: i + 1]) > s; an s at or past the total gives the last positive row."""
    return min(int(np.searchsorted(np.cumsum(values), s, side="right")), int(np.flatnonzero(values)[-1]))


@pytest.mark.parametrize("capacity", [1, 2, 5, 8, 13, 64, 100])
def test_sums_and_mins_of_random_ranges_match_brute_force(capacity: int) -> None:
    rng = np.random.default_rng(capacity)
    sum_tree, min_tree = SumSegmentTree(capacity), MinSegmentTree(capacity)
    values = np.zeros(capacity)
    mins = np.full(capacity, np.inf)
    for _ in range(20):
        idxes = rng.integers(0, capacity, size=rng.integers(1, 2 * capacity + 1))
        new = rng.random(len(idxes)) * 10
        sum_tree[idxes] = new
        min_tree[idxes] = new - 5
        values[idxes] = new  # NumPy assignment: the last of repeated indexes wins, as in the tree
        mins[idxes] = new - 5
        assert sum_tree.total() == pytest.approx(values.sum())
        assert min_tree.min() == pytest.approx(mins.min())
        for _ in range(10):
            start = int(rng.integers(0, capacity + 1))
            end = int(rng.integers(start, capacity + 1))
            assert sum_tree.sum(start, end) == pytest.approx(values[start:end].sum())
            expected_min = mins[start:end].min() if end > start else np.inf
            assert min_tree.min(start, end) == pytest.approx(expected_min)
        np.testing.assert_array_equal(sum_tree[np.arange(capacity)], values)
        np.testing.assert_array_equal(sum_tree.leaves(), values)


def test_single_index_get_and_set() -> None:
    tree = SumSegmentTree(4)
    tree[2] = 3.5
    tree[np.int64(0)] = 1.0
    assert tree[2] == 3.5 and isinstance(tree[2], float)
    assert tree.total() == 4.5
    assert tree.sum(1, 3) == 3.5
    assert tree.sum(end=1) == 1.0
    assert tree.sum(2, 2) == 0.0
    assert MinSegmentTree(4).min() == np.inf


def test_scalar_value_broadcasts_over_index_array() -> None:
    tree = SumSegmentTree(10)
    tree[np.arange(10)] = 2.0
    assert tree.total() == 20.0


def test_inner_nodes_do_not_drift_after_many_updates() -> None:
    rng = np.random.default_rng(0)
    tree = SumSegmentTree(1000)
    for _ in range(200):
        idxes = rng.integers(0, 1000, size=64)
        tree[idxes] = rng.random(64) * 1e6
    tree[np.arange(1000)] = 1.0
    assert tree.total() == 1000.0


@pytest.mark.parametrize("capacity", [1, 3, 8, 37])
def test_find_prefixsum_idx_matches_brute_force(capacity: int) -> None:
    rng = np.random.default_rng(capacity)
    # Whole numbers keep every partial sum exact, so the row boundaries themselves can be tested.
    values = rng.integers(1, 100, capacity) * (rng.random(capacity) > 0.3).astype(float)  # some zeros
    values[rng.integers(capacity)] = 7.0  # at least one positive
    tree = SumSegmentTree(capacity)
    tree[np.arange(capacity)] = values
    total = values.sum()
    boundaries = np.cumsum(values)
    prefix_sums = np.concatenate([rng.random(500) * total, boundaries[:-1], boundaries[:-1] - 0.5, [0.0]])
    found = tree.find_prefixsum_idx(prefix_sums)
    expected = [brute_prefixsum_idx(values, s) for s in prefix_sums]
    assert found.dtype == np.int64
    np.testing.assert_array_equal(found, expected)
    assert np.all(values[found] > 0)


def test_find_prefixsum_idx_on_random_floats() -> None:
    rng = np.random.default_rng(7)
    values = rng.random(300) * (rng.random(300) > 0.5)
    tree = SumSegmentTree(300)
    tree[np.arange(300)] = values
    prefix_sums = rng.random(2000) * values.sum()
    expected = [brute_prefixsum_idx(values, s) for s in prefix_sums]
    np.testing.assert_array_equal(tree.find_prefixsum_idx(prefix_sums), expected)


def test_find_prefixsum_idx_edge_cases() -> None:
    tree = SumSegmentTree(8)
    values = np.array([0.0, 1.0, 0.0, 2.0, 0.0, 3.0, 0.0, 0.0])
    tree[np.arange(8)] = values
    # Exactly on a boundary: that row's mass is used up, the next positive row is chosen.
    assert tree.find_prefixsum_idx(0.0) == 1
    assert tree.find_prefixsum_idx(1.0) == 3
    assert tree.find_prefixsum_idx(2.999) == 3
    assert tree.find_prefixsum_idx(3.0) == 5
    # Out of range (or round-off past the total) clamps to the first / last positive row.
    assert tree.find_prefixsum_idx(-1.0) == 1
    assert tree.find_prefixsum_idx(6.0) == 5
    assert tree.find_prefixsum_idx(1e9) == 5
    assert tree.find_prefixsum_idx(np.nextafter(6.0, 0)) == 5
    # Shapes: scalar in, int out; array in, same-shaped array out; empty in, empty out.
    assert isinstance(tree.find_prefixsum_idx(0.5), int)
    assert tree.find_prefixsum_idx(np.array([[0.5, 5.5]])).shape == (1, 2)
    assert tree.find_prefixsum_idx(np.array([])).shape == (0,)


def test_find_prefixsum_idx_never_lands_on_padding_or_empty_leaves() -> None:
    capacity = 1000  # padded to 1024 leaves
    tree = SumSegmentTree(capacity)
    rng = np.random.default_rng(1)
    tree[np.arange(600)] = rng.random(600) ** 8  # tiny values invite round-off
    total = tree.total()
    s = np.concatenate([np.linspace(0, total, 10_001), total * (1 - 1e-16) + np.zeros(10)])
    found = tree.find_prefixsum_idx(s)
    assert found.max() < 600
    assert np.all(tree[found] > 0)


def test_invalid_use_raises() -> None:
    with pytest.raises(ValueError, match="capacity"):
        SumSegmentTree(0)
    tree = SumSegmentTree(4)
    with pytest.raises(ValueError, match="positive total"):
        tree.find_prefixsum_idx(0.0)
    with pytest.raises(IndexError, match="4"):
        tree[4] = 1.0
    with pytest.raises(IndexError, match="-1"):
        tree[np.array([0, -1])] = 1.0
    with pytest.raises(IndexError):
        tree.sum(2, 1)
    with pytest.raises(IndexError):
        tree.sum(0, 5)
    for bad in (-1.0, np.nan, np.inf):
        with pytest.raises(ValueError, match="finite and >= 0"):
            tree[1] = bad
    assert tree.total() == 0.0  # a rejected update changes nothing
    tree[0] = 1.0
    with pytest.raises(ValueError, match="NaN"):
        tree.find_prefixsum_idx(np.array([np.nan]))
    MinSegmentTree(4)[1] = -3.0  # minimum trees take any value
