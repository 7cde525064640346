"""Segment trees: sums and minimums over ranges of a fixed-size array in O(log n).

Prioritized replay (Schaul et al., 2016) keeps one priority per stored row and needs, per
operation, a priority update, the total, the minimum, and the row at which a running sum of
priorities passes a given value. A binary tree whose every node holds the reduction of its
two children answers all of these in O(log n).

The tree lives in one NumPy array of ``2 * size`` entries, ``size`` being the capacity
rounded up to a power of two: node 1 is the root, node ``k`` has children ``2k`` and
``2k + 1``, and leaf ``i`` is node ``size + i``. Leaves beyond the capacity hold the
reduction's neutral element, so they never change a result. Updates and prefix-sum
searches take whole index arrays and work one tree level at a time, vectorized across the
batch, which is what a replay buffer does with a sampled batch.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["MinSegmentTree", "SegmentTree", "SumSegmentTree"]


def _is_integer(value: object) -> bool:
    # Takes ``object`` so the check does not narrow an ``int`` to "int and numbers.Integral",
    # which mypy deems impossible (marking the rest of the caller unreachable); NumPy integers
    # count, bools do not.
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class SegmentTree:
    """A complete binary tree of float64 values reduced by an associative ``operation``.

    ``tree[i] = v`` and ``tree[idxes] = values`` (an index array; with repeated indexes the
    last value wins, as in NumPy assignment) set leaves and refresh their ancestors;
    ``tree[i]`` / ``tree[idxes]`` read leaves. ``reduce(start, end)`` reduces the leaves in
    ``[start, end)``. Subclasses name the operation: :class:`SumSegmentTree`,
    :class:`MinSegmentTree`.
    """

    def __init__(self, capacity: int, operation: Callable[[Any, Any], Any], neutral_element: float) -> None:
        if not _is_integer(capacity) or capacity < 1:
            raise ValueError(f"segment tree capacity must be an integer >= 1, got {capacity!r}")
        self.capacity = int(capacity)
        self._size = 1 << (self.capacity - 1).bit_length()  # next power of two >= capacity
        self._depth = self._size.bit_length() - 1
        self._operation = operation
        self._neutral = float(neutral_element)
        self._value = np.full(2 * self._size, self._neutral, dtype=np.float64)

    # -- leaves ------------------------------------------------------------------------

    def _check_idxes(self, idxes: np.ndarray) -> None:
        if idxes.size and (idxes.min() < 0 or idxes.max() >= self.capacity):
            bad = idxes[(idxes < 0) | (idxes >= self.capacity)][0]
            raise IndexError(f"segment tree index {int(bad)} is out of range [0, {self.capacity})")

    def _check_values(self, values: np.ndarray) -> None:
        """Hook for subclasses that restrict leaf values."""

    def __setitem__(self, idx: int | np.ndarray, value: float | np.ndarray) -> None:
        idxes = np.atleast_1d(np.asarray(idx))
        if idxes.dtype.kind not in "iu":
            raise TypeError(f"segment tree indexes must be integers, got dtype {idxes.dtype}")
        values = np.broadcast_to(np.asarray(value, dtype=np.float64), idxes.shape).ravel()
        idxes = idxes.ravel().astype(np.int64, copy=False)
        if idxes.size == 0:
            return
        self._check_idxes(idxes)
        self._check_values(values)
        nodes = idxes + self._size
        self._value[nodes] = values
        # Refresh each level's touched parents from their (already current) children, so an
        # inner node is always exactly op(left, right): no drift however many updates happen. A
        # parent listed twice gets the same value twice, which is cheaper than deduplicating.
        tree, operation = self._value, self._operation
        for _ in range(self._depth):
            nodes >>= 1
            tree[nodes] = operation(tree[2 * nodes], tree[2 * nodes + 1])

    def __getitem__(self, idx: int | np.ndarray) -> Any:
        idxes = np.asarray(idx)
        if idxes.dtype.kind not in "iu":
            raise TypeError(f"segment tree indexes must be integers, got dtype {idxes.dtype}")
        self._check_idxes(np.atleast_1d(idxes))
        result = self._value[self._size + idxes]
        return float(result) if result.ndim == 0 else result

    def leaves(self) -> np.ndarray:
        """A copy of the ``capacity`` leaf values."""
        leaves: np.ndarray = self._value[self._size : self._size + self.capacity].copy()
        return leaves

    # -- ranges ------------------------------------------------------------------------

    def reduce(self, start: int = 0, end: int | None = None) -> float:
        """``operation`` over the leaves ``[start, end)``; ``end=None`` means the capacity.

        An empty range gives the neutral element (0 for sums, +inf for minimums).
        """
        end = self.capacity if end is None else end
        if not 0 <= start <= end <= self.capacity:
            raise IndexError(f"segment tree range [{start}, {end}) is not within [0, {self.capacity}]")
        if start == 0 and end == self._size:
            return float(self._value[1])
        # Walk both ends up together: a left end that is a right child (or a right end that is a
        # left child's successor) contributes its node and moves inward, so each level adds at
        # most two nodes.
        result_left = self._neutral
        result_right = self._neutral
        lo, hi = start + self._size, end + self._size
        while lo < hi:
            if lo & 1:
                result_left = self._operation(result_left, self._value[lo])
                lo += 1
            if hi & 1:
                hi -= 1
                result_right = self._operation(self._value[hi], result_right)
            lo >>= 1
            hi >>= 1
        return float(self._operation(result_left, result_right))

    def __len__(self) -> int:
        return self.capacity

    def __repr__(self) -> str:
        return f"{type(self).__name__}(capacity={self.capacity}, root={self._value[1]!r})"


class SumSegmentTree(SegmentTree):
    """Sums of non-negative leaves, with the prefix-sum search that proportional sampling needs."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity, np.add, 0.0)

    def _check_values(self, values: np.ndarray) -> None:
        ok = np.isfinite(values) & (values >= 0)
        if not ok.all():
            bad = values[np.flatnonzero(~ok)[0]]
            raise ValueError(f"SumSegmentTree values must be finite and >= 0, got {float(bad)!r}")

    def sum(self, start: int = 0, end: int | None = None) -> float:
        """The sum of the leaves ``[start, end)``."""
        return self.reduce(start, end)

    def total(self) -> float:
        """The sum of all leaves (the root), in O(1)."""
        return float(self._value[1])

    def find_prefixsum_idx(self, prefix_sums: float | np.ndarray) -> Any:
        """For each ``s``, the smallest index ``i`` with ``sum(0, i + 1) > s``.

        That is the row proportional sampling picks for a uniform ``s`` in ``[0, total())``.
        The result is always a leaf with a positive value: an ``s`` below 0 gives the first
        such leaf, and an ``s`` at or above the total (or pushed there by float round-off)
        gives the last. Takes a scalar or an array, returns the same (int64 indexes);
        O(log n) per element, one vectorized step per tree level.
        """
        total = self.total()
        if not total > 0:
            raise ValueError(f"find_prefixsum_idx needs a positive total, the tree's total is {total!r}")
        scalar = np.ndim(prefix_sums) == 0
        remaining = np.maximum(np.atleast_1d(np.asarray(prefix_sums, dtype=np.float64)).ravel(), 0.0)
        if np.isnan(remaining).any():
            raise ValueError("find_prefixsum_idx got a NaN prefix sum")
        nodes = np.ones(remaining.shape, dtype=np.int64)
        for _ in range(self._depth):
            left = 2 * nodes
            left_value = self._value[left]
            # Descend right only into a subtree holding mass: with exact arithmetic that is
            # implied by s < total, and it keeps round-off from ending on an empty leaf.
            go_right = (remaining >= left_value) & (self._value[left + 1] > 0)
            remaining = np.where(go_right, remaining - left_value, remaining)
            nodes = left + go_right
        idxes = nodes - self._size
        return int(idxes[0]) if scalar else idxes.reshape(np.shape(prefix_sums))


class MinSegmentTree(SegmentTree):
    """Minimums of the leaves (unset leaves are +inf)."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity, np.minimum, float("inf"))

    def min(self, start: int = 0, end: int | None = None) -> float:
        """The minimum of the leaves ``[start, end)``; with no arguments, of all leaves in O(1)."""
        if start == 0 and end is None:
            return float(self._value[1])
        return self.reduce(start, end)
