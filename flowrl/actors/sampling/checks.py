"""What the samplers check of an env's output and read of its state.

:class:`ObservationCheck` (an observation against the env's space) and :func:`reward_problem`
say what must not reach the learner; :func:`env_snapshot` pickles an env mid-episode for the
sampler's state.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.utils import EzPickle

from flowrl.data import SampleBatch
from flowrl.envs.checker import VECTOR_ENV_HINT, abbreviate, element_name
from flowrl.envs.flatten import ObsFlattener, is_structured


def env_snapshot(env: Any) -> bytes | None:
    """``env`` pickled with its state (mid-episode), or None where that cannot be done faithfully.

    Gymnasium's ``EzPickle`` envs pickle their constructor arguments only, so unpickling one
    starts it afresh: those, and envs that cannot be pickled at all, give None.
    """
    if isinstance(getattr(env, "unwrapped", env), EzPickle):
        return None
    try:
        snapshot: bytes = cloudpickle.dumps(env)
        return snapshot
    except Exception:  # noqa: BLE001 - any env may hold something unpicklable (a socket, an emulator)
        return None


def reward_problem(reward: Any, field: str = "reward") -> str | None:
    """What is wrong with one reward (not a real number, or not finite), or None; ``field`` names it."""
    if np.ndim(reward) > 0 and np.size(reward) > 1:  # one reward per env: the env steps several at once
        return (
            f"{field}={abbreviate(reward)} of type {type(reward).__name__}, which is not one real number; "
            f"{VECTOR_ENV_HINT}"
        )
    try:
        value = float(reward)
    except (TypeError, ValueError):
        return f"{field}={abbreviate(reward)} of type {type(reward).__name__}, which is not a real number"
    return None if math.isfinite(value) else f"{field}={value}, which is not finite"


class ObservationCheck:
    """What an observation must be to reach the learner, read from the env's observation space.

    Array spaces (Box, Discrete, MultiDiscrete, MultiBinary) give a shape, a dtype the
    observation must cast to (same kind: float64 into float32 is fine, float into int is
    not) and bounds. Floating observations must be finite. Dict and Tuple observations are
    checked flattened, against ``flatten_space(space)`` (samplers flatten them with
    :attr:`flatten`); observations of other spaces (Text, Graph, ...) are only checked to be finite.
    """

    def __init__(self, space: gym.Space[Any] | None, space_name: str = "observation_space") -> None:
        #: Flattens Dict and Tuple observations into rows of ``flatten_space(space)``; None for other spaces.
        self.flatten = ObsFlattener(space) if space is not None and is_structured(space) else None
        self._structure_name = space_name
        if self.flatten is not None:
            space, space_name = self.flatten.space, f"flatten_space({space_name})"
        self.space_name = space_name
        self.shape: tuple[int, ...] | None = None
        self.dtype: np.dtype | None = None
        #: Bounds broadcast to ``shape``; None where no value of the dtype can break them (e.g. -inf).
        self.low: np.ndarray | None = None
        self.high: np.ndarray | None = None
        # (class, dtype, shape) of values already found to have the right shape and a castable dtype.
        self._good_forms: set[tuple[type, Any, Any]] = set()
        self._finite_bounds: tuple[np.ndarray, np.ndarray] | None = None
        if isinstance(space, spaces.Box):
            low, high = space.low, space.high
        elif isinstance(space, spaces.Discrete):
            low, high = np.asarray(space.start), np.asarray(space.start + space.n - 1)
        elif isinstance(space, spaces.MultiDiscrete):
            low, high = space.start, space.start + space.nvec - 1
        elif isinstance(space, spaces.MultiBinary):
            low, high = np.zeros(space.shape, np.int8), np.ones(space.shape, np.int8)
        else:
            return
        assert space is not None and space.shape is not None and space.dtype is not None
        self.shape, self.dtype = tuple(space.shape), np.dtype(space.dtype)
        low, high = np.broadcast_to(low, self.shape), np.broadcast_to(high, self.shape)
        if self.dtype.kind == "f":
            lowest, highest = -np.inf, np.inf
        elif self.dtype.kind in "iu":
            lowest, highest = np.iinfo(self.dtype).min, np.iinfo(self.dtype).max
        else:
            return
        self.low = low if bool(np.any(low > lowest)) else None
        self.high = high if bool(np.any(high < highest)) else None
        if self.dtype.kind == "f" and self.has_bounds:
            # Infinite bounds replaced by the dtype's extremes: then one comparison per side also
            # rejects NaN (no comparison holds) and infinities, without a separate finiteness pass.
            finite = np.finfo(self.dtype).max
            self._finite_bounds = (np.maximum(low, -finite), np.minimum(high, finite))

    @property
    def has_bounds(self) -> bool:
        """Whether a finite value can be out of the space."""
        return self.low is not None or self.high is not None

    def form_problem(self, value: Any, field: str) -> str | None:
        """What is wrong with ``value``'s shape or dtype, or None; ``field`` names it in the message."""
        if self.flatten is not None and not isinstance(value, np.ndarray):  # it could not be flattened
            return f"{field}={abbreviate(value)}, which does not fit {self._structure_name} {self.flatten.structure}"
        key = (value.__class__, getattr(value, "dtype", None), getattr(value, "shape", None))
        cacheable = isinstance(value, (np.ndarray, np.generic, int, float))
        if cacheable and key in self._good_forms:
            return None
        array = np.asarray(value)
        if self.shape is not None and array.shape != self.shape:
            return f"{field}={abbreviate(value)} with shape {array.shape}, but {self.space_name}.shape is {self.shape}"
        if self.dtype is not None and not np.can_cast(array.dtype, self.dtype, "same_kind"):
            return (
                f"{field}={abbreviate(value)} of dtype {array.dtype}, which does not cast to "
                f"{self.space_name}.dtype {self.dtype}"
            )
        if cacheable:
            self._good_forms.add(key)
        return None

    def value_problem(self, value: Any, field: str) -> str | None:
        """What is wrong with ``value``'s numbers (of a right form): not finite, or out of bounds; or None."""
        array = np.asarray(value)
        if array.dtype.kind == "f":
            bad = np.argwhere(~np.isfinite(array))
            if len(bad):
                index = tuple(bad[0])
                return f"{element_name(field, index)}={abbreviate(array[index])}, which is not finite"
        for bound, name, relation in ((self.low, "low", "below"), (self.high, "high", "above")):
            if bound is None:
                continue
            bad = np.argwhere(array < bound if relation == "below" else array > bound)
            if len(bad):
                index = tuple(bad[0])
                limit = element_name(f"{self.space_name}.{name}", index)
                return (
                    f"{element_name(field, index)}={abbreviate(array[index])} {relation} "
                    f"{limit}={abbreviate(bound[index])}"
                )
        return None

    def problem(self, value: Any, field: str) -> str | None:
        """Everything wrong with one observation (the first problem found), or None."""
        problem = self.form_problem(value, field)
        if problem is not None:
            return problem
        array = np.asarray(value)
        # The vectorized passes first: the element-wise look that names the culprit is much slower.
        return None if self.rows_ok(array[None]) else self.value_problem(array, field)

    def rows_ok(self, rows: np.ndarray) -> bool:
        """Whether every observation stacked in ``rows`` (``[n, ...]``) is right, in a few vectorized passes.

        False may also mean a sum overflowed: :meth:`problem` on each row says which (if any) is wrong.
        """
        if self.shape is not None and rows.shape[1:] != self.shape:
            return False
        if self.dtype is not None and rows.dtype != self.dtype and not np.can_cast(rows.dtype, self.dtype, "same_kind"):
            return False
        if self._finite_bounds is not None:
            low, high = self._finite_bounds
            return bool((rows >= low).all()) and bool((rows <= high).all())
        if rows.dtype.kind == "f" and not math.isfinite(np.add.reduce(rows, axis=None)):
            return False
        return self.all_in_bounds(rows)

    def all_in_bounds(self, rows: np.ndarray) -> bool:
        """Whether every observation in ``rows`` (``[..., *shape]``) is inside the bounds."""
        return (self.low is None or bool((rows >= self.low).all())) and (
            self.high is None or bool((rows <= self.high).all())
        )

    def in_bounds(self, rows: np.ndarray) -> np.ndarray:
        """Per row of ``rows`` (``[..., *shape]``): whether it is inside the bounds (vectorized)."""
        assert self.shape is not None
        lead = rows.ndim - len(self.shape)
        axes = tuple(range(lead, rows.ndim))
        ok = np.ones(rows.shape[:lead], dtype=bool)
        if self.low is not None:
            ok &= (rows >= self.low).all(axis=axes)
        if self.high is not None:
            ok &= (rows <= self.high).all(axis=axes)
        return ok


def bad_rows(
    columns: Mapping[str, np.ndarray], keep: np.ndarray, check: ObservationCheck
) -> Iterator[tuple[int, int, str | None]]:
    """The rows of a fragment's ``[T, N]`` columns with a non-finite reward, a non-finite or out-of-bounds
    ``new_obs``, or (a row that starts an episode) an out-of-bounds ``obs``, in step order: ``(step, env,
    problem)``, where ``problem`` says what is wrong with the reward or ``new_obs``, or is None when it is the
    row's ``obs``. A quick pass over whole columns first; only when it fails are rows looked at one by one.
    Lazy: a row whose ``keep`` the caller has cleared meanwhile (its episode dropped) is skipped.
    """
    rewards, new_obs, obs = (columns[k] for k in (SampleBatch.REWARDS, SampleBatch.NEW_OBS, SampleBatch.OBS))
    floating = new_obs.dtype.kind == "f"
    if (
        math.isfinite(np.add.reduce(rewards, axis=None))
        and (not floating or math.isfinite(np.add.reduce(new_obs, axis=None)))
        and check.all_in_bounds(new_obs)
        and check.all_in_bounds(obs)  # its rows are earlier rows' new_obs (checked) or a reset's
    ):
        return
    starts = columns[SampleBatch.T] == 0  # rows whose obs came from a reset, not an earlier row's new_obs
    bad = ~np.isfinite(rewards)
    if floating:
        bad |= ~np.isfinite(new_obs.reshape(*bad.shape, -1)).all(axis=-1)
    if check.has_bounds:
        bad |= ~check.in_bounds(new_obs)
        bad[starts] |= ~check.in_bounds(obs[starts])
    for step, i in np.argwhere(bad & keep).tolist():  # in step order, as they happened
        if keep[step, i]:
            yield step, i, reward_problem(rewards[step, i]) or check.value_problem(new_obs[step, i], "new_obs")
