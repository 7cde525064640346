"""Stepping a set of envs with one batched policy forward pass per vector step.

The sampler writes each step into preallocated ``[T, num_envs, ...]`` arrays, then cuts
every env's column into trajectory pieces (one per episode part), postprocesses each
piece with the policy (advantages, n-step returns, ...) and concatenates them. For a
policy that postprocesses nothing (IMPALA's: V-trace corrects in the learner) the
fragment is returned whole, in the same row order, without cutting it.

Faults are absorbed here when the config asks for it (see :class:`FaultTolerantSampler`):
an env that raises is recreated and its episode dropped, and an observation or reward that
must not reach the learner either raises :class:`~flowrl.errors.BadObservationError` or has
its episode dropped.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import cloudpickle
import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.utils import EzPickle

from flowrl.actors.sampling.episode_hooks import EpisodeHooks
from flowrl.data import SampleBatch, concat_samples
from flowrl.envs.checker import abbreviate, element_name
from flowrl.envs.envpool_backend import shared_vector
from flowrl.envs.episodes import recorded_episode, records_episodes
from flowrl.envs.flatten import ObsFlattener, is_structured
from flowrl.errors import BadObservationError, EnvError, FlowRLError
from flowrl.policy import Policy
from flowrl.policy.filters import MeanStdFilter, filter_fragment

BATCH_MODES = ("truncate_episodes", "complete_episodes")
BAD_OBSERVATION_MODES = ("raise", "drop_episode")
#: Finished episodes a sampler keeps until they are collected (a worker nobody asks must not grow).
MAX_UNCOLLECTED_EPISODES = 10_000
#: Episodes of one env slot dropped in a row (env errors or bad data) before the sampler gives up on it:
#: dropping is meant for rare faults, and an env that fails every episode would otherwise spin forever.
MAX_DROPPED_IN_A_ROW = 100

EnvMaker = Callable[[int], Any]
"""Builds a new env for a vector index (the slot of the env it replaces)."""

def env_snapshot(env: Any) -> bytes | None:
    """``env`` pickled with its state (mid-episode), or None where that cannot be done faithfully.

    Gymnasium's ``EzPickle`` envs pickle their constructor arguments only, so unpickling one
    starts it afresh: those, and envs that cannot be pickled at all, give None.
    """
    if isinstance(getattr(env, "unwrapped", env), EzPickle):
        return None
    try:
        return cloudpickle.dumps(env)
    except Exception:  # noqa: BLE001 - any env may hold something unpicklable (a socket, an emulator)
        return None


@dataclass
class EpisodeStats:
    """Return and length (env steps) of one finished episode, and its custom metrics.

    In multi-agent episodes ``episode_reward`` sums every agent's rewards and
    ``policy_rewards`` lists each agent's return under the id of the policy it acted with.
    ``custom_metrics`` holds what callbacks and ``custom_metrics_from_info`` recorded.
    """

    episode_reward: float
    episode_length: int
    policy_rewards: dict[str, list[float]] = field(default_factory=dict)
    custom_metrics: dict[str, float] = field(default_factory=dict)


def reward_problem(reward: Any, field: str = "reward") -> str | None:
    """What is wrong with one reward (not a real number, or not finite), or None; ``field`` names it."""
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

    def __init__(self, space: gym.Space | None, space_name: str = "observation_space") -> None:
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
                return f"{element_name(field, index)}={abbreviate(array[index])} {relation} {limit}={abbreviate(bound[index])}"
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


class FaultTolerantSampler:
    """What both samplers share: their envs, finished-episode statistics, and the handling of faults.

    ``env_maker(vector_index)`` (optional) builds a replacement for an env that raised in
    ``step`` or ``reset``: the old one is closed, the new one reset, the episode that was
    running is dropped and counted in ``num_faulty_episodes``. Without it the env's
    exception propagates unchanged. ``on_bad_observation`` says what a non-finite, wrongly
    shaped or out-of-space observation, or a non-finite reward, does: ``"raise"`` a
    :class:`~flowrl.errors.BadObservationError` naming the worker (``worker_index``), env,
    step, field, value and bound; ``"drop_episode"`` drops that episode, resets the env and
    counts it in ``num_bad_observations``. A dropped episode's rows are never returned and it
    is not a finished episode. Either counter is cumulative. An env slot whose episodes are
    dropped :data:`MAX_DROPPED_IN_A_ROW` times in a row raises.

    ``hooks`` (optional) follows each env's episode for the run's callbacks and custom metrics;
    the episodes in progress are saved with the sampler's state.
    """

    def __init__(
        self,
        envs: list[Any],
        *,
        env_maker: EnvMaker | None,
        on_bad_observation: str,
        worker_index: int,
        seed: int | None,
        hooks: EpisodeHooks | None = None,
    ) -> None:
        if on_bad_observation not in BAD_OBSERVATION_MODES:
            raise ValueError(f"on_bad_observation={on_bad_observation!r} is not one of {BAD_OBSERVATION_MODES}")
        # The caller's list, replaced in place: the rollout worker closes the envs the sampler holds.
        self.envs = envs
        self.env_maker = env_maker
        self.on_bad_observation = on_bad_observation
        self.worker_index = worker_index
        self.hooks = hooks
        self.num_faulty_episodes = 0
        self.num_bad_observations = 0
        # Seconds spent stepping the envs and in the policies' forward passes (the X-ray), while ``timed``.
        self.timed = True
        self.env_s = 0.0
        self.inference_s = 0.0
        # Bounded: a worker whose statistics nobody collects must not grow without limit.
        self.finished: collections.deque[EpisodeStats] = collections.deque(maxlen=MAX_UNCOLLECTED_EPISODES)
        self._dropped_in_a_row = [0] * len(envs)
        # Seeds for recreated envs, derived from the sampler's seed: the same faults give the same run.
        self._reseed = None if seed is None else np.random.default_rng([seed & (2**64 - 1), 0x5EED])

    #: What, besides the envs, makes up the sampler's progress between two samples (subclasses add theirs).
    STATE_ATTRS: ClassVar[tuple[str, ...]] = (
        "num_faulty_episodes", "num_bad_observations", "finished", "_dropped_in_a_row", "_reseed",
    )

    def get_state(self) -> dict[str, Any]:
        """The envs, each pickled mid-episode (None where an env cannot be, see :func:`env_snapshot`),
        the episodes in progress, the fault counters and the seed stream: what resuming
        sampling exactly where it was needs."""
        state = copy.deepcopy({name: getattr(self, name) for name in self.STATE_ATTRS})
        episodes = None if self.hooks is None else self.hooks.get_state()
        return {**state, "envs": [env_snapshot(env) for env in self.envs], "episodes": episodes}

    def set_state(self, state: Mapping[str, Any]) -> list[int]:
        """Restore :meth:`get_state`'s output into a sampler with as many envs.

        Returns the vector indices of the envs whose state could not be restored: they start
        a new episode. With a different number of envs nothing is restored and every env
        index is returned.
        """
        snapshots = state["envs"]
        if len(snapshots) != len(self.envs):
            return list(range(len(self.envs)))
        for name in self.STATE_ATTRS:
            setattr(self, name, copy.deepcopy(state[name]))
        if self.hooks is not None:
            self.hooks.set_state(state.get("episodes"))
        fresh = []
        for i, snapshot in enumerate(snapshots):
            if snapshot is None:
                fresh.append(i)
                continue
            with contextlib.suppress(Exception):  # the replaced env's close must not stop the restore
                self.envs[i].close()
            self.envs[i] = cloudpickle.loads(snapshot)
        for i in fresh:
            self._restart_episode(i)
        return fresh

    def _restart_episode(self, index: int) -> None:
        """Start a new episode in env ``index``, dropping what the sampler holds of the one before."""
        raise NotImplementedError

    def pop_episode_stats(self) -> list[EpisodeStats]:
        """Episodes finished since the last call (the most recent ones, if very many).

        Safe while another thread samples: each episode is taken from the deque once.
        """
        popped: list[EpisodeStats] = []
        while True:
            try:
                popped.append(self.finished.popleft())
            except IndexError:
                return popped

    def _recreate_env(self, index: int, method: str, error: Exception) -> int | None:
        """Replace env ``index`` (there is an env maker), which raised ``error`` in ``method``.

        Returns the seed to reset the new env with (None for an unseeded sampler).
        """
        assert self.env_maker is not None
        with contextlib.suppress(Exception):  # a broken env may fail to close too; it is discarded anyway
            self.envs[index].close()
        self.num_faulty_episodes += 1
        failure = EnvError(self._where(index, f"{method} raised {type(error).__name__}: {error}"))
        self._count_dropped(index, failure, error)
        self.envs[index] = self.env_maker(index)
        return None if self._reseed is None else int(self._reseed.integers(2**31))

    def _bad_data(self, index: int, where: str, problem: str) -> None:
        """Raise for bad data from env ``index`` (``where``: the call and step), or count the episode to drop."""
        message = f"{self._where(index, where)} returned {problem}"
        if self.on_bad_observation == "raise":
            raise BadObservationError(
                f"{message} (on_bad_observation='raise'; 'drop_episode' drops such episodes and counts them)"
            )
        self.num_bad_observations += 1
        self._count_dropped(index, BadObservationError(message), None)

    def _count_dropped(self, index: int, last: FlowRLError, cause: Exception | None) -> None:
        """Count a dropped episode of env ``index``; raise (``last`` says why it was dropped) past the cap."""
        self._dropped_in_a_row[index] += 1
        if self._dropped_in_a_row[index] >= MAX_DROPPED_IN_A_ROW:
            message = f"{MAX_DROPPED_IN_A_ROW} episodes in a row of one env were dropped; the last: {last}"
            raise type(last)(message) from cause

    def _episode_kept(self, index: int) -> None:
        self._dropped_in_a_row[index] = 0

    def _where(self, index: int, what: str) -> str:
        return f"worker {self.worker_index}, env {index}: {what}"


def no_clock() -> float:
    """The clock of a sampler that times nothing (``timed`` off): always 0."""
    return 0.0


@dataclass
class _Fragment:
    """One ``_run``'s ``[T, n, ...]`` columns, which of their rows to return, and the episodes it finished."""

    columns: dict[str, np.ndarray]
    keep: np.ndarray
    #: ``(episode id, stats)``: published once the fragment's checks passed (a check may drop one).
    finished: list[tuple[int, EpisodeStats]] = field(default_factory=list)


class VectorSampler(FaultTolerantSampler):
    """Samples fragments from ``envs`` with ``policy``.

    ``truncate_episodes``: each :meth:`sample` returns ``fragment_length`` steps per env;
    episodes running at the end are cut (and bootstrapped by postprocessing). The rows of
    a dropped episode (see :class:`FaultTolerantSampler`) are left out, so such a
    fragment holds fewer than ``fragment_length * num_envs`` rows (an env may have none).
    ``complete_episodes``: only whole episodes are returned, at least
    ``fragment_length * num_envs`` steps; unfinished ones carry over to the next call.

    Every observation (from ``reset`` and ``step``) and reward is checked, at the least
    cost: each observation's shape and dtype as it arrives (a wrong shape may broadcast
    silently into the buffer); that the observations the policy acts on next are finite,
    once per vector step; the rest (rewards, bounds, final observations) once per
    fragment, over all of its rows at once, before it is returned.

    ``obs_filter`` (optional): the policy acts on the observations it filters, and the
    fragments hold those (the checks above read the raw ones).
    """

    def __init__(
        self,
        envs: list[gym.Env],
        policy: Policy,
        *,
        fragment_length: int,
        batch_mode: str = "truncate_episodes",
        seed: int | None = None,
        episode_id_base: int = 0,
        clip_actions: bool = True,
        env_maker: EnvMaker | None = None,
        on_bad_observation: str = "raise",
        worker_index: int = 0,
        hooks: EpisodeHooks | None = None,
        obs_filter: MeanStdFilter | None = None,
    ) -> None:
        if batch_mode not in BATCH_MODES:
            raise ValueError(f"batch_mode={batch_mode!r} is not one of {BATCH_MODES}")
        super().__init__(
            envs, env_maker=env_maker, on_bad_observation=on_bad_observation, worker_index=worker_index, seed=seed,
            hooks=hooks,
        )
        self.policy = policy
        self.obs_filter = obs_filter
        self.fragment_length = fragment_length
        self.batch_mode = batch_mode
        space = envs[0].action_space
        self._clip = (space.low, space.high) if clip_actions and isinstance(space, gym.spaces.Box) else None
        self._obs_check = ObservationCheck(getattr(envs[0], "observation_space", None))
        self._flatten = self._obs_check.flatten
        #: Checks on (the default); benchmarks/sampler_checks.py turns them off to measure their cost.
        self._check_data = True
        n = len(envs)
        self._next_episode_id = episode_id_base
        self.eps_ids = np.array([self._new_episode_id() for _ in range(n)], dtype=np.int64)
        self.ts = np.zeros(n, dtype=np.int64)
        self.episode_rewards = np.zeros(n, dtype=np.float64)
        self.steps_sampled = 0
        resets = [self._reset(i, None if seed is None else seed + i, 0, full=True) for i in range(n)]
        observations = [obs for obs, _, _ in resets]
        dtype = self._obs_check.dtype
        self.obs = np.stack(observations) if dtype is None else np.stack(observations).astype(dtype)
        if hooks is not None:
            for i, (_, raw, info) in enumerate(resets):
                hooks.start(i, int(self.eps_ids[i]), raw, info)
        self._carry: list[list[SampleBatch]] = [[] for _ in range(n)]

    STATE_ATTRS = FaultTolerantSampler.STATE_ATTRS + (
        "_next_episode_id", "eps_ids", "ts", "episode_rewards", "steps_sampled", "obs", "_carry",
    )

    def _restart_episode(self, index: int) -> None:
        self._carry[index] = []
        self._start_episode(index, None if self._reseed is None else int(self._reseed.integers(2**31)), 0)

    def _new_episode_id(self) -> int:
        self._next_episode_id += 1
        return self._next_episode_id

    def sample(self) -> SampleBatch:
        """One fragment: ``fragment_length`` steps per env, postprocessed."""
        if self.batch_mode == "truncate_episodes":
            fragment = self._run()
            if not self.policy.postprocesses:  # the pieces would be concatenated unchanged
                return self._whole(fragment)
            return concat_samples([self.policy.postprocess_trajectory(p) for p in self._pieces(fragment)])
        done: list[SampleBatch] = []
        target = self.fragment_length * len(self.envs)
        while sum(b.count for b in done) < target:
            for piece in self._pieces(self._run()):
                env_index = int(piece[SampleBatch.ENV_ID][0])
                self._carry[env_index].append(piece)
                last = len(piece) - 1
                if piece[SampleBatch.TERMINATEDS][last] or piece[SampleBatch.TRUNCATEDS][last]:
                    episode = concat_samples(self._carry[env_index])
                    self._carry[env_index] = []
                    done.append(self.policy.postprocess_trajectory(episode))
        return concat_samples(done)

    def _run(self) -> _Fragment:
        """Step every env ``fragment_length`` times; return the ``[T, n]`` fragment, its checks passed."""
        T, n = self.fragment_length, len(self.envs)
        obs_buf = np.empty((T, *self.obs.shape), dtype=self.obs.dtype)
        new_obs_buf = np.empty_like(obs_buf)
        rewards = np.empty((T, n), dtype=np.float32)
        terminateds = np.empty((T, n), dtype=bool)
        truncateds = np.empty((T, n), dtype=bool)
        eps_ids = np.empty((T, n), dtype=np.int64)
        ts = np.empty((T, n), dtype=np.int64)
        fragment = _Fragment(
            {
                SampleBatch.OBS: obs_buf,
                SampleBatch.NEW_OBS: new_obs_buf,
                SampleBatch.REWARDS: rewards,
                SampleBatch.TERMINATEDS: terminateds,
                SampleBatch.TRUNCATEDS: truncateds,
                SampleBatch.EPS_ID: eps_ids,
                SampleBatch.T: ts,
            },
            np.ones((T, n), dtype=bool),
        )
        check = self._check_data
        shape, dtype = self.obs.shape[1:], self.obs.dtype
        check_finite = check and dtype.kind == "f"
        # Bound once: the checks run for every env on every step, where each lookup shows.
        ndarray, isfinite, add_all = np.ndarray, math.isfinite, np.add.reduce
        flatten, hooks = self._flatten, self.hooks
        actions_buf: np.ndarray | None = None
        extra_bufs: dict[str, np.ndarray] = {}
        obs_filter = self.obs_filter
        filtered = None if obs_filter is None else np.empty((T, *self.obs.shape), dtype=np.float32)
        pool = shared_vector(self.envs)  # a worker's EnvPool, stepped in one call, or None
        recording = [records_episodes(env) for env in self.envs]  # read per fragment: a recreated env may differ
        clock = time.perf_counter if self.timed else no_clock
        for step in range(T):
            started = clock()
            policy_obs = self.obs if obs_filter is None else obs_filter(self.obs)
            actions, extra = self.policy.compute_actions(policy_obs)
            inferred = clock()
            if filtered is not None:
                filtered[step] = policy_obs
            if actions_buf is None:
                actions_buf = np.empty((T, *actions.shape), dtype=actions.dtype)
                extra_bufs = {k: np.empty((T, *v.shape), dtype=v.dtype) for k, v in extra.items()}
            actions_buf[step] = actions
            for key, value in extra.items():
                extra_bufs[key][step] = value
            obs_buf[step] = self.obs
            eps_ids[step] = self.eps_ids
            ts[step] = self.ts
            env_actions = np.clip(actions, *self._clip) if self._clip is not None else actions
            # Each result goes straight into the step's rows: no per-step lists or stacking.
            new_obs, step_rewards = new_obs_buf[step], rewards[step]
            step_terms, step_truncs = terminateds[step], truncateds[step]
            dropped: dict[int, int | None] = {}  # env -> the seed of its reset: episodes to drop
            stepped: dict[int, tuple[Any, Any]] = {}  # env -> (observation, info) as the env returned them
            # Env -> (return, length) of the episode it recorded ending; None: a training episode ended
            # inside the recorded one (a lost life), which goes on. Envs that record nothing are not here.
            recorded: dict[int, tuple[float, int] | None] = {}
            if pool is not None:  # every env in one call; EnvPool's arrays have the space's shape and dtype
                recorded = pool.step(env_actions, new_obs, step_rewards, step_terms, step_truncs)
                if hooks is not None:
                    stepped = {i: (new_obs[i], pool.info(i)) for i in range(n)}
            else:
                for i, env in enumerate(self.envs):
                    try:
                        obs, reward, step_terms[i], step_truncs[i], info = env.step(env_actions[i])
                    except Exception as error:
                        if self.env_maker is None:
                            raise
                        dropped[i] = self._recreate_env(i, "env.step()", error)
                        self._placeholder(fragment, step, i)
                        continue
                    if recording[i] and (step_terms[i] or step_truncs[i]):
                        recorded[i] = recorded_episode(info)
                    if hooks is not None:
                        stepped[i] = (obs, info)
                    if flatten is not None:
                        obs = flatten(obs)
                    # A wrong shape may broadcast silently into the row (a scalar fills it): check the form first.
                    if not check or (obs.__class__ is ndarray and obs.shape == shape and obs.dtype is dtype):
                        try:
                            new_obs[i], step_rewards[i] = obs, reward
                            continue
                        except (TypeError, ValueError):
                            if not check:
                                raise
                    if not self._write_checked(fragment, step, i, obs, reward):
                        dropped[i] = None
            stepped_at = clock()
            self.inference_s += inferred - started
            self.env_s += stepped_at - inferred
            self.obs[:] = new_obs
            self.episode_rewards += step_rewards
            self.ts += 1
            if hooks is not None:
                for i, (obs, info) in stepped.items():
                    if i not in dropped:
                        hooks.step(i, obs, float(step_rewards[i]), info)
            for env_index in np.flatnonzero(terminateds[step] | truncateds[step]).tolist():
                if env_index in dropped:
                    self._discard_episode(fragment, env_index, step)
                    self._start_episode(env_index, dropped[env_index], step + 1)
                    continue
                if env_index in recorded:
                    episode = recorded[env_index]
                    if episode is None:  # a lost life: a new training episode in the same recorded one
                        self._next_life(env_index, step + 1, pool is not None)
                        continue
                    stats = EpisodeStats(*episode)
                else:
                    stats = EpisodeStats(float(self.episode_rewards[env_index]), int(self.ts[env_index]))
                fragment.finished.append((int(self.eps_ids[env_index]), stats))
                if hooks is not None:
                    hooks.end(env_index)
                self._episode_kept(env_index)
                self._start_episode(env_index, None, step + 1)
            # One reduction over what the policy reads next (new and reset observations): a sum is
            # finite only if every value is (an overflowing sum is cleared by the closer look).
            if check_finite and not isfinite(add_all(self.obs, axis=None)):
                self._drop_nonfinite(fragment, step)
        assert actions_buf is not None
        fragment.columns.update({SampleBatch.ACTIONS: actions_buf, **extra_bufs})
        if self._check_data:
            self._check_fragment(fragment)
        if obs_filter is not None and filtered is not None:
            filter_fragment(fragment.columns, filtered, obs_filter)
        self.steps_sampled += T * n
        if hooks is not None:  # the episodes that passed the fragment's checks count: they end now
            published = hooks.publish([episode_id for episode_id, _ in fragment.finished])
            for (_, stats), metrics in zip(fragment.finished, published):
                stats.custom_metrics = metrics
        self.finished.extend(stats for _, stats in fragment.finished)
        return fragment

    def _write_checked(self, fragment: _Fragment, step: int, i: int, obs: Any, reward: Any) -> bool:
        """Write env ``i``'s step result into row ``step`` if its observation's form and its reward are right.

        Otherwise raise or (returning False) leave a placeholder row that ends the episode to drop.
        """
        problem = self._obs_check.form_problem(obs, "new_obs")
        if problem is None:
            fragment.columns[SampleBatch.NEW_OBS][step, i] = obs
            try:
                fragment.columns[SampleBatch.REWARDS][step, i] = reward
                return True
            except (TypeError, ValueError):
                problem = reward_problem(reward) or f"reward={abbreviate(reward)}"
        self._bad_data(i, self._step_where(i, step), problem)
        self._placeholder(fragment, step, i)
        return False

    def _drop_nonfinite(self, fragment: _Fragment, step: int) -> None:
        """Handle the envs whose next observation (after row ``step``) is not finite: a new one, or a reset's."""
        for i in np.flatnonzero(~np.isfinite(self.obs.reshape(len(self.obs), -1)).all(axis=1)).tolist():
            if self.ts[i] == 0:  # the env was just reset: only that first observation is bad
                where = f"env.reset() (vector step {self._vector_step(step + 1)})"
                self._bad_data(i, where, self._problem(self.obs[i], "obs"))
            else:
                t = int(fragment.columns[SampleBatch.T][step, i])
                where = f"env.step() at step {t} of its episode (vector step {self._vector_step(step)})"
                self._bad_data(i, where, self._problem(self.obs[i], "new_obs"))
                self._placeholder(fragment, step, i)
                self._discard_episode(fragment, i, step)
            self._start_episode(i, None, step + 1, full=True)

    def _problem(self, value: Any, field: str) -> str:
        return self._obs_check.value_problem(value, field) or f"{field}={abbreviate(value)}"

    def _placeholder(self, fragment: _Fragment, step: int, i: int) -> None:
        """Fill row ``step`` of env ``i`` with valid values that end its episode (the row is dropped with it)."""
        columns = fragment.columns
        columns[SampleBatch.NEW_OBS][step, i] = columns[SampleBatch.OBS][step, i]
        columns[SampleBatch.REWARDS][step, i] = 0.0
        columns[SampleBatch.TERMINATEDS][step, i] = False
        columns[SampleBatch.TRUNCATEDS][step, i] = True

    def _step_where(self, i: int, step: int) -> str:
        return f"env.step() at step {int(self.ts[i])} of its episode (vector step {self._vector_step(step)})"

    def _vector_step(self, row: int) -> int:
        """The sampler's count of vector steps at ``row`` of the fragment in progress."""
        return self.steps_sampled // len(self.envs) + row

    def _next_life(self, i: int, row: int, pooled: bool) -> None:
        """Env ``i`` ended a training episode inside the episode it records (a lost life), from ``row`` on
        the next: the recorded episode goes on, with its id, step count and callbacks' episode.

        A Gymnasium env is reset to play on (:class:`~flowrl.envs.atari.EpisodicLife` starts the
        next life); EnvPool plays on by itself, from the observation it returned.
        """
        if not pooled:
            self.obs[i], _, _ = self._reset(i, None, row, full=False)

    def _start_episode(self, i: int, seed: int | None, row: int, *, full: bool = False) -> None:
        """Reset env ``i`` for a new episode starting at ``row`` of the fragment (``fragment_length``: the next one)."""
        self.episode_rewards[i] = 0.0
        self.ts[i] = 0
        self.eps_ids[i] = self._new_episode_id()
        self.obs[i], raw, info = self._reset(i, seed, row, full=full)
        if self.hooks is not None:
            self.hooks.start(i, int(self.eps_ids[i]), raw, info)

    def _reset(self, i: int, seed: int | None, row: int, *, full: bool) -> tuple[Any, Any, Any]:
        """Env ``i``'s first observation of a new episode (recreating the env or resetting again as needed):
        ``(observation as sampled, observation as the env returned it, info)``.

        Its form is checked here; its values too with ``full``, else by the caller's
        per-step finiteness check and the fragment's bounds check.
        """
        while True:
            try:
                raw, info = self.envs[i].reset(seed=seed)
            except Exception as error:
                if self.env_maker is None:
                    raise
                seed = self._recreate_env(i, "env.reset()", error)
                continue
            obs = raw if self._flatten is None else self._flatten(raw)
            if not self._check_data:
                return obs, raw, info
            if not full:
                rows = self.obs
                if obs.__class__ is np.ndarray and obs.shape == rows.shape[1:] and obs.dtype is rows.dtype:
                    return obs, raw, info  # the right form; its values are checked with the step's and the fragment's
            check = self._obs_check
            problem = check.problem(obs, "obs") if full else check.form_problem(obs, "obs")
            if problem is None:
                return obs, raw, info
            self._bad_data(i, f"env.reset() (vector step {self._vector_step(row)})", problem)
            seed = None

    def _check_fragment(self, fragment: _Fragment) -> None:
        """Check the fragment's rewards, final observations and bounds; drop (or raise for) the episodes at fault.

        A quick pass over whole columns first; only when it fails are rows looked at one by one.
        """
        columns, check = fragment.columns, self._obs_check
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
        bad &= fragment.keep
        for step, i in np.argwhere(bad).tolist():  # in step order, as they happened
            if not fragment.keep[step, i]:
                continue  # its episode was dropped for an earlier row
            vector_step = self._vector_step(step)
            problem = reward_problem(rewards[step, i]) or check.value_problem(new_obs[step, i], "new_obs")
            if problem is not None:
                t = int(columns[SampleBatch.T][step, i])
                self._bad_data(i, f"env.step() at step {t} of its episode (vector step {vector_step})", problem)
            else:  # the row's obs, the first of its episode
                self._bad_data(i, f"env.reset() (vector step {vector_step})", self._problem(obs[step, i], "obs"))
            if self._discard_episode(fragment, i, step):
                self._start_episode(i, None, len(bad), full=True)

    def _discard_episode(self, fragment: _Fragment, i: int, step: int) -> bool:
        """Drop env ``i``'s episode holding row ``step``: its rows, carried pieces and statistics.

        Returns whether that episode is still running at the end of the fragment.
        """
        columns = fragment.columns
        ends = columns[SampleBatch.TERMINATEDS][:, i] | columns[SampleBatch.TRUNCATEDS][:, i]
        before, after = np.flatnonzero(ends[:step]), np.flatnonzero(ends[step:])
        start = int(before[-1]) + 1 if len(before) else 0
        stop = step + int(after[0]) + 1 if len(after) else len(ends)
        fragment.keep[start:stop, i] = False
        eps_id = int(columns[SampleBatch.EPS_ID][step, i])
        fragment.finished = [(e, stats) for e, stats in fragment.finished if e != eps_id]
        carry = self._carry[i]
        if carry and int(carry[0][SampleBatch.EPS_ID][0]) == eps_id:
            self._carry[i] = []
        return not len(after)

    def _whole(self, fragment: _Fragment) -> SampleBatch:
        """The ``[T, n]`` columns as one batch, env by env (the rows of :meth:`_pieces` concatenated), dropped episodes left out."""
        T, n = self.fragment_length, len(self.envs)
        columns = {k: v.swapaxes(0, 1).reshape(T * n, *v.shape[2:]) for k, v in fragment.columns.items()}
        columns[SampleBatch.ENV_ID] = np.repeat(np.arange(n, dtype=np.int64), T)
        keep = fragment.keep.T.reshape(-1)
        if not keep.all():
            columns = {k: v[keep] for k, v in columns.items()}
        return SampleBatch(columns)

    def _pieces(self, fragment: _Fragment) -> list[SampleBatch]:
        """Cut ``[T, n]`` columns into one batch per env and episode part, leaving out dropped episodes."""
        T, n = self.fragment_length, len(self.envs)
        columns = fragment.columns
        ends = columns[SampleBatch.TERMINATEDS] | columns[SampleBatch.TRUNCATEDS]
        pieces: list[SampleBatch] = []
        for i in range(n):
            env_columns: dict[str, Any] = {k: v[:, i] for k, v in columns.items()}
            env_columns[SampleBatch.ENV_ID] = np.full(T, i, dtype=np.int64)
            bounds = [0, *(np.flatnonzero(ends[:, i]) + 1).tolist()]
            if bounds[-1] != T:
                bounds.append(T)
            for start, stop in zip(bounds[:-1], bounds[1:]):
                if fragment.keep[start, i]:  # a dropped episode's rows are exactly whole pieces
                    pieces.append(SampleBatch({k: v[start:stop] for k, v in env_columns.items()}))
        return pieces
