"""Observation filters: what a policy sees instead of an env's raw observations.

- :class:`RunningStats`: count, mean and spread of vectors, mergeable across processes.
- :class:`MeanStdFilter`: normalizes observations by the running mean and std of every
  observation seen so far (RLlib's ``observation_filter: MeanStdFilter``). Each rollout worker
  keeps one; the statistics it gathered since the last sync (its *delta*) are merged into the
  driver's filter once per training iteration and the merged statistics go back to every
  worker (:meth:`flowrl.actors.WorkerSet.sync_filters`).
- :func:`make_observation_filter`: the filter a config's ``observation_filter`` names.
- :func:`filter_fragment`: a sampled fragment's observation columns replaced by the filtered
  observations the policy acted on.

Sample batches hold filtered observations, so a policy learns from what it acted on, and the
filter travels with checkpoints and the portable policy files (:mod:`flowrl.serve.inference`), so
evaluation and inference normalize as training did.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from flowrl.data import SampleBatch
from flowrl.errors import ConfigError

if TYPE_CHECKING:
    import numpy.typing as npt

#: The values of the ``observation_filter`` config key.
OBSERVATION_FILTERS = ("NoFilter", "MeanStdFilter")
# Components whose std is below this are only shifted, not scaled: a constant input stays finite.
_MIN_STD = 1e-6


class RunningStats:
    """Count, mean and sum of squared deviations of vectors, mergeable across workers (Chan et al.)."""

    def __init__(self, dim: int) -> None:
        self.count = 0.0
        self.mean = np.zeros(dim, dtype=np.float64)
        self.m2 = np.zeros(dim, dtype=np.float64)

    @classmethod
    def of(cls, values: np.ndarray) -> RunningStats:
        """The statistics of the rows of ``values`` (``[n, dim]``)."""
        values = np.asarray(values, dtype=np.float64).reshape(len(values), -1)
        stats = cls(values.shape[1])
        if len(values):
            stats.count = float(len(values))
            stats.mean = values.mean(axis=0)
            stats.m2 = ((values - stats.mean) ** 2).sum(axis=0)
        return stats

    def copy(self) -> RunningStats:
        """An independent copy."""
        return copy.deepcopy(self)

    def push(self, values: np.ndarray) -> None:
        """Add the rows of ``values``."""
        self.merge(RunningStats.of(values))

    def merge(self, other: RunningStats) -> None:
        """Add the vectors ``other`` summarizes."""
        if other.count == 0:
            return
        total = self.count + other.count
        delta = other.mean - self.mean
        self.mean = self.mean + delta * (other.count / total)
        self.m2 = self.m2 + other.m2 + delta**2 * (self.count * other.count / total)
        self.count = total

    @property
    def var(self) -> npt.NDArray[np.float64]:
        """Population variance per component (0 before any vector)."""
        return self.m2 / self.count if self.count > 0 else np.zeros_like(self.m2)

    @property
    def std(self) -> np.ndarray:
        """Population standard deviation per component."""
        return np.sqrt(self.var)

    def normalization(self) -> tuple[np.ndarray, np.ndarray]:
        """``(shift, scale)`` normalizing observations: the mean and std, with 1 where the std is ~0."""
        if self.count == 0:
            return np.zeros_like(self.mean), np.ones_like(self.mean)
        std = self.std
        return self.mean.copy(), np.where(std > _MIN_STD, std, 1.0)


class MeanStdFilter:
    """Normalizes observations to ``(obs - mean) / std`` with the running statistics of all observations seen.

    Calling it on a batch ``[n, *obs_shape]`` first adds the batch to the statistics (unless
    ``update=False``) and then normalizes it with them, as RLlib's filter did; components whose
    std is ~0 are only shifted, and no statistics yet leave observations unchanged. Outputs are
    float32. The statistics are of flattened observations, so any Box shape works.

    Across processes: :meth:`pop_delta` hands over what this filter saw since the last call,
    :meth:`apply_delta` adds another filter's delta (the driver's merge), and :meth:`sync`
    takes merged statistics while keeping the observations seen since the delta was popped.
    Thread-safe: a worker samples in one thread while its control thread syncs.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total: RunningStats | None = None  # every observation these statistics count (here and merged)
        self._delta: RunningStats | None = None  # observations seen here since the last pop_delta

    def __call__(self, obs: np.ndarray, update: bool = True) -> np.ndarray:
        """``obs`` (a batch, first axis the rows) normalized; with ``update`` its rows join the statistics first."""
        obs = np.asarray(obs)
        rows = obs.reshape(len(obs), -1)
        with self._lock:
            if update and len(rows):
                batch = RunningStats.of(rows)
                self._total = _merged(self._total, batch)
                self._delta = _merged(self._delta, batch)
            total = self._total
            shift, scale = total.normalization() if total is not None else (0.0, 1.0)
        return ((rows - shift) / scale).astype(np.float32).reshape(obs.shape)

    def stats(self) -> RunningStats | None:
        """A copy of the statistics the filter normalizes with (None before any observation)."""
        with self._lock:
            return None if self._total is None else self._total.copy()

    def pop_delta(self) -> RunningStats | None:
        """The statistics of the observations seen here since the last call (None if none), handed over once."""
        with self._lock:
            delta, self._delta = self._delta, None
        return delta

    def apply_delta(self, delta: RunningStats | None) -> None:
        """Add another filter's delta (what :meth:`pop_delta` returned there) to these statistics."""
        if delta is None:
            return
        with self._lock:
            self._total = _merged(self._total, delta)

    def sync(self, merged: RunningStats | None) -> None:
        """Take ``merged`` statistics (the driver's), plus the observations seen here since the last
        :meth:`pop_delta`."""
        with self._lock:
            total = None if merged is None else merged.copy()
            if self._delta is not None:
                total = _merged(total, self._delta)
            self._total = total

    def get_state(self) -> dict[str, Any]:
        """The statistics and the delta not yet handed over: what a checkpoint keeps."""
        with self._lock:
            return {"total": copy.deepcopy(self._total), "delta": copy.deepcopy(self._delta)}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`get_state`'s output."""
        with self._lock:
            self._total = copy.deepcopy(state["total"])
            self._delta = copy.deepcopy(state["delta"])

    def to_json(self) -> dict[str, Any]:
        """A JSON-able description: ``{"type": "MeanStdFilter", "count": n, "mean": [...], "std": [...]}``
        (``mean`` and ``std`` of the flattened observations; empty lists before any observation)."""
        stats = self.stats()
        if stats is None:
            return {"type": "MeanStdFilter", "count": 0, "mean": [], "std": []}
        return {"type": "MeanStdFilter", "count": stats.count, "mean": stats.mean.tolist(), "std": stats.std.tolist()}

    @classmethod
    def from_json(cls, description: Mapping[str, Any]) -> MeanStdFilter:
        """The filter :meth:`to_json` described (``KeyError``/``ValueError``/``TypeError`` if malformed)."""
        if description["type"] != "MeanStdFilter":
            raise ValueError(f"unknown observation filter type {description['type']!r}")
        count = float(description["count"])
        mean = np.asarray(description["mean"], dtype=np.float64).reshape(-1)
        std = np.asarray(description["std"], dtype=np.float64).reshape(-1)
        if mean.shape != std.shape or count < 0 or (count > 0 and not len(mean)):
            raise ValueError(f"count={count}, {len(mean)} means and {len(std)} stds do not describe statistics")
        obs_filter = cls()
        if count > 0:
            stats = RunningStats(len(mean))
            stats.count, stats.mean, stats.m2 = count, mean, std**2 * count
            obs_filter._total = stats
        return obs_filter

    def __repr__(self) -> str:
        stats = self.stats()
        return f"MeanStdFilter(count={0 if stats is None else int(stats.count)})"


def _merged(stats: RunningStats | None, other: RunningStats) -> RunningStats:
    """``stats`` with ``other`` added (``stats`` is changed in place), or a copy of ``other`` if there is none."""
    if stats is None:
        return other.copy()
    stats.merge(other)
    return stats


def make_observation_filter(
    name: str, observation_space: gym.Space[Any] | None, *, multi_agent: bool = False
) -> MeanStdFilter | None:
    """The filter the ``observation_filter`` config key names for an env: None for ``"NoFilter"``.

    Raises :class:`~flowrl.errors.ConfigError` for an unknown name, and for ``"MeanStdFilter"``
    on a multi-agent env or an observation space of indices (Discrete, MultiDiscrete, MultiBinary),
    which a mean and std do not describe.
    """
    if name == "NoFilter":
        return None
    if name != "MeanStdFilter":
        raise ConfigError([f"observation_filter={name!r} must be one of {', '.join(map(repr, OBSERVATION_FILTERS))}"])
    if multi_agent:
        raise ConfigError(
            [
                "observation_filter='MeanStdFilter' filters single-agent envs only; this env is multi-agent "
                "(use 'NoFilter')"
            ]
        )
    if isinstance(observation_space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
        raise ConfigError(
            [
                f"observation_filter='MeanStdFilter' normalizes continuous observations, but the observation "
                f"space is {observation_space} (use 'NoFilter')"
            ]
        )
    return MeanStdFilter()


def filter_fragment(columns: dict[str, np.ndarray], filtered_obs: np.ndarray, obs_filter: MeanStdFilter) -> None:
    """Replace a sampled fragment's ``[T, n, ...]`` ``obs`` and ``new_obs`` columns by filtered observations.

    ``filtered_obs[t]`` is what the policy acted on at step ``t``: the filtered ``obs``. Each
    row's filtered ``new_obs`` is the next row's filtered ``obs`` when that row continues the
    episode; at an episode's end and in the last row it is the raw ``new_obs`` filtered without
    updating the statistics (those observations are counted when the policy acts on them).
    """
    ends = columns[SampleBatch.TERMINATEDS] | columns[SampleBatch.TRUNCATEDS]
    new_obs = np.empty_like(filtered_obs)
    new_obs[:-1] = filtered_obs[1:]
    cut = ends.copy()
    cut[-1] = True
    steps, envs = np.nonzero(cut)
    new_obs[steps, envs] = obs_filter(columns[SampleBatch.NEW_OBS][steps, envs], update=False)
    columns[SampleBatch.OBS] = filtered_obs
    columns[SampleBatch.NEW_OBS] = new_obs
