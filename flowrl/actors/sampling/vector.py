"""Stepping a set of envs with one batched policy forward pass per vector step.

The sampler writes each step into preallocated ``[T, num_envs, ...]`` arrays, then cuts
every env's column into trajectory pieces (one per episode part), postprocesses each
piece with the policy (advantages, n-step returns, ...) and concatenates them. For a
policy that postprocesses nothing (IMPALA's: V-trace corrects in the learner) the
fragment is returned whole, in the same row order, without cutting it.

Faults are absorbed here when the config asks for it (see
:class:`~flowrl.actors.sampling.recovery.FaultTolerantSampler`): an env that raises is
recreated and its episode dropped, and an observation or reward that must not reach the
learner either raises :class:`~flowrl.errors.BadObservationError` or has its episode dropped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from flowrl.actors.sampling.checks import ObservationCheck, bad_rows, reward_problem
from flowrl.actors.sampling.episode_hooks import EpisodeHooks
from flowrl.actors.sampling.fragment import _Fragment
from flowrl.actors.sampling.masks import ActionMasks
from flowrl.actors.sampling.recovery import EnvMaker, EpisodeStats, FaultTolerantSampler, no_clock
from flowrl.actors.sampling.recurrent_state import RecurrentState
from flowrl.data import SampleBatch, concat_samples
from flowrl.data.sequences import chop_into_sequences
from flowrl.envs.checker import abbreviate
from flowrl.envs.envpool_backend import EnvPoolVector, shared_vector
from flowrl.envs.episodes import recorded_episode, records_episodes
from flowrl.policy.filters import MeanStdFilter, filter_fragment
from flowrl.policy.protocols import SamplingPolicy

BATCH_MODES = ("truncate_episodes", "complete_episodes")


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

    Action masks (a Discrete action space, and a masked Dict observation space or
    ``info["action_mask"]`` from ``reset`` on; see :mod:`flowrl.envs.flatten`): the policy acts with
    each env's current mask, and the fragments hold the ``action_mask`` of each row's observation and
    the ``next_action_mask`` of its ``new_obs``. A mask that allows no action where the policy must act
    (after ``reset``, or a step that ended nothing) is a bad observation, checked as the others are.

    A recurrent policy acts from each env's state (:class:`RecurrentState`, reset at every episode start);
    its pieces are cut into sequences (:func:`~flowrl.data.sequences.chop_into_sequences`).
    """

    def __init__(
        self,
        envs: list[gym.Env],
        policy: SamplingPolicy,
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
            envs,
            env_maker=env_maker,
            on_bad_observation=on_bad_observation,
            worker_index=worker_index,
            seed=seed,
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
        n = len(envs)
        self.masks = ActionMasks(envs[0], n, worker_index)
        # A duck-typed stand-in (no Policy subclass) written before recurrent policies has no state.
        initial: list[np.ndarray] = getattr(policy, "get_initial_state", list)()
        #: A recurrent policy's state per env (None for a feed-forward policy).
        self.recurrent = RecurrentState(initial, n, space) if initial else None
        #: Checks on (the default); benchmarks/sampler_checks.py turns them off to measure their cost.
        self._check_data = True
        self._next_episode_id = episode_id_base
        self.eps_ids = np.array([self._new_episode_id() for _ in range(n)], dtype=np.int64)
        self.ts = np.zeros(n, dtype=np.int64)
        self.episode_rewards = np.zeros(n, dtype=np.float64)
        self.steps_sampled = 0
        #: Called after each vector step (a rollout worker counts its progress with it).
        self.on_step: Callable[[], object] = no_clock
        resets = [self._reset(i, None if seed is None else seed + i, 0, full=True) for i in range(n)]
        observations = [obs for obs, _, _ in resets]
        dtype = self._obs_check.dtype
        self.obs = np.stack(observations) if dtype is None else np.stack(observations).astype(dtype)
        if hooks is not None:
            for i, (_, raw, info) in enumerate(resets):
                hooks.start(i, int(self.eps_ids[i]), raw, info)
        self._carry: list[list[SampleBatch]] = [[] for _ in range(n)]

    STATE_ATTRS = FaultTolerantSampler.STATE_ATTRS + (
        "_next_episode_id",
        "eps_ids",
        "ts",
        "episode_rewards",
        "steps_sampled",
        "obs",
        "_carry",
    )

    def get_state(self) -> dict[str, Any]:
        return {
            **super().get_state(),
            "action_masks": self.masks.get_state(),
            "recurrent": None if self.recurrent is None else self.recurrent.get_state(),
        }

    def set_state(self, state: Mapping[str, Any]) -> list[int]:
        # Before the envs: an env that cannot be restored starts an episode, and with it its mask and state.
        if "action_masks" in state and len(state["envs"]) == len(self.envs):
            self.masks.set_state(state["action_masks"])
        saved = state.get("recurrent")  # absent in checkpoints older than recurrent policies
        if self.recurrent is not None and saved is not None and len(state["envs"]) == len(self.envs):
            self.recurrent.set_state(saved)
        return super().set_state(state)

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
            if not self.policy.postprocesses and self.recurrent is None:  # the pieces would be concatenated unchanged
                return fragment.whole()
            return concat_samples([self._finish_piece(p) for p in fragment.pieces()])
        done: list[SampleBatch] = []
        target = self.fragment_length * len(self.envs)
        while sum(b.count for b in done) < target:
            for piece in self._run().pieces():
                env_index = int(piece[SampleBatch.ENV_ID][0])
                self._carry[env_index].append(piece)
                if piece[SampleBatch.TERMINATEDS][-1] or piece[SampleBatch.TRUNCATEDS][-1]:
                    episode = concat_samples(self._carry[env_index])
                    self._carry[env_index] = []
                    done.append(self._finish_piece(episode))
        return concat_samples(done)

    def _finish_piece(self, piece: SampleBatch) -> SampleBatch:
        """One env's piece postprocessed, and a recurrent policy's cut into sequences."""
        piece = self.policy.postprocess_trajectory(piece)
        return piece if self.recurrent is None else chop_into_sequences(piece, self.policy.max_seq_len)

    def _run(self) -> _Fragment:
        """Step every env ``fragment_length`` times; return the ``[T, n]`` fragment, its checks passed."""
        T, n = self.fragment_length, len(self.envs)
        obs_buf = np.empty((T, *self.obs.shape), dtype=self.obs.dtype)
        fragment = _Fragment(
            {
                SampleBatch.OBS: obs_buf,
                SampleBatch.NEW_OBS: np.empty_like(obs_buf),
                SampleBatch.REWARDS: np.empty((T, n), dtype=np.float32),
                SampleBatch.TERMINATEDS: np.empty((T, n), dtype=bool),
                SampleBatch.TRUNCATEDS: np.empty((T, n), dtype=bool),
                SampleBatch.EPS_ID: np.empty((T, n), dtype=np.int64),
                SampleBatch.T: np.empty((T, n), dtype=np.int64),
            },
            np.ones((T, n), dtype=bool),
            filtered=None if self.obs_filter is None else np.empty((T, *self.obs.shape), dtype=np.float32),
        )
        fragment.columns.update(self.masks.columns(T))
        if self.recurrent is not None:
            fragment.columns.update(self.recurrent.columns(T))
        pool = shared_vector(self.envs)  # a worker's EnvPool, stepped in one call, or None
        recording = [records_episodes(env) for env in self.envs]  # read per fragment: a recreated env may differ
        clock = time.perf_counter if self.timed else no_clock
        for step in range(T):
            self._step_all(fragment, step, pool, recording, clock)
            self.on_step()
        return self._finish_fragment(fragment)

    def _step_all(
        self,
        fragment: _Fragment,
        step: int,
        pool: EnvPoolVector | None,
        recording: list[bool],
        clock: Callable[[], float],
    ) -> None:
        """Fill row ``step``: one timed policy forward pass for all envs, a step of each, and their episodes' ends."""
        started = clock()
        obs_filter = self.obs_filter
        policy_obs = self.obs if obs_filter is None else obs_filter(self.obs)
        columns = fragment.columns
        # Masks only where the fragment has their columns (made when the envs were known to be masked).
        masks = self.masks.current if SampleBatch.ACTION_MASK in columns else None
        recurrent, inputs = self.recurrent, dict[str, Any]()
        if masks is not None:
            columns[SampleBatch.ACTION_MASK][step] = inputs["action_mask"] = masks
        if recurrent is not None:
            inputs.update(recurrent.record(columns, step))
        actions, extra = self.policy.compute_actions(policy_obs, **inputs)
        inferred = clock()
        if fragment.filtered is not None:
            fragment.filtered[step] = policy_obs
        fragment.add_actions(step, actions, extra)
        columns[SampleBatch.OBS][step] = self.obs
        columns[SampleBatch.EPS_ID][step] = self.eps_ids
        columns[SampleBatch.T][step] = self.ts
        env_actions = np.clip(actions, *self._clip) if self._clip is not None else actions
        # Each result goes straight into the step's rows: no per-step lists or stacking.
        new_obs, step_rewards = columns[SampleBatch.NEW_OBS][step], columns[SampleBatch.REWARDS][step]
        step_terms, step_truncs = columns[SampleBatch.TERMINATEDS][step], columns[SampleBatch.TRUNCATEDS][step]
        hooks = self.hooks
        dropped: dict[int, int | None] = {}  # env -> the seed of its reset: episodes to drop
        stepped: dict[int, tuple[Any, Any]] = {}  # env -> (observation, info) as the env returned them
        # Env -> (return, length) of the episode it recorded ending; None: a training episode ended
        # inside the recorded one (a lost life), which goes on. Envs that record nothing are not here.
        recorded: dict[int, tuple[float, int] | None] = {}
        if pool is not None:  # every env in one call; EnvPool's arrays have the space's shape and dtype
            recorded = pool.step(env_actions, new_obs, step_rewards, step_terms, step_truncs)
            if hooks is not None:
                stepped = {i: (new_obs[i], pool.info(i)) for i in range(len(self.envs))}
        else:
            self._step_each_env(fragment, step, env_actions, recording, dropped, stepped, recorded)
        stepped_at = clock()
        self.inference_s += inferred - started
        self.env_s += stepped_at - inferred
        self.obs[:] = new_obs
        if masks is not None:
            masks[:] = columns[SampleBatch.NEXT_ACTION_MASK][step]
        if recurrent is not None:  # before the episodes that ended start again from the initial state
            recurrent.advance(extra, actions, step_rewards)
        self.episode_rewards += step_rewards
        self.ts += 1
        if hooks is not None:
            for i, (obs, info) in stepped.items():
                if i not in dropped:
                    hooks.step(i, obs, float(step_rewards[i]), info)
        self._end_episodes(fragment, step, step_terms | step_truncs, dropped, recorded, pool is not None)
        # One reduction over what the policy reads next (new and reset observations): a sum is
        # finite only if every value is (an overflowing sum is cleared by the closer look).
        if self._check_data and self.obs.dtype.kind == "f" and not math.isfinite(np.add.reduce(self.obs, axis=None)):
            self._drop_nonfinite(fragment, step)

    def _step_each_env(
        self,
        fragment: _Fragment,
        step: int,
        env_actions: np.ndarray,
        recording: list[bool],
        dropped: dict[int, int | None],
        stepped: dict[int, tuple[Any, Any]],
        recorded: dict[int, tuple[float, int] | None],
    ) -> None:
        """Step the envs one at a time into row ``step``, adding to ``dropped``, ``stepped`` and ``recorded``."""
        columns = fragment.columns
        new_obs, step_rewards = columns[SampleBatch.NEW_OBS][step], columns[SampleBatch.REWARDS][step]
        step_terms, step_truncs = columns[SampleBatch.TERMINATEDS][step], columns[SampleBatch.TRUNCATEDS][step]
        check, hooks, flatten = self._check_data, self.hooks, self._flatten
        next_masks = columns.get(SampleBatch.NEXT_ACTION_MASK)
        shape, dtype = self.obs.shape[1:], self.obs.dtype
        # Bound once: the checks run for every env on every step, where each lookup shows.
        ndarray = np.ndarray
        for i, env in enumerate(self.envs):
            try:
                obs, reward, step_terms[i], step_truncs[i], info = env.step(env_actions[i])
            except Exception as error:
                if self.env_maker is None:
                    raise
                dropped[i] = self._recreate_env(i, "env.step()", error)
                fragment.end_row(step, i)
                continue
            if recording[i] and (step_terms[i] or step_truncs[i]):
                recorded[i] = recorded_episode(info)
            if hooks is not None:
                stepped[i] = (obs, info)
            if next_masks is not None:
                self.masks.read(i, obs, info, next_masks[step])
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
        if check and next_masks is not None:  # an episode that goes on needs a legal action next
            for i in np.flatnonzero(~(step_terms | step_truncs | next_masks[step].any(axis=1))).tolist():
                self._bad_data(i, self._step_where(i, step), self.masks.problem(next_masks[step, i], "new_obs"))
                fragment.end_row(step, i)
                dropped[i] = None

    def _end_episodes(
        self,
        fragment: _Fragment,
        step: int,
        ends: np.ndarray,
        dropped: dict[int, int | None],
        recorded: dict[int, tuple[float, int] | None],
        pooled: bool,
    ) -> None:
        """Drop or finish the episodes that ended (``ends``) in row ``step``, and start the next ones."""
        hooks = self.hooks
        for env_index in np.flatnonzero(ends).tolist():
            if env_index in dropped:
                self._discard_episode(fragment, env_index, step)
                self._start_episode(env_index, dropped[env_index], step + 1)
                continue
            if env_index in recorded:
                episode = recorded[env_index]
                if episode is None:  # a lost life: a new training episode in the same recorded one
                    self._next_life(env_index, step + 1, pooled)
                    continue
                stats = EpisodeStats(*episode)
            else:
                stats = EpisodeStats(float(self.episode_rewards[env_index]), int(self.ts[env_index]))
            fragment.finished.append((int(self.eps_ids[env_index]), stats))
            if hooks is not None:
                hooks.end(env_index)
            self._episode_kept(env_index)
            self._start_episode(env_index, None, step + 1)

    def _finish_fragment(self, fragment: _Fragment) -> _Fragment:
        """Add the actions to the fragment, check and filter it, count its steps and publish its finished episodes."""
        assert fragment.actions is not None
        fragment.columns.update({SampleBatch.ACTIONS: fragment.actions, **fragment.extras})
        if self._check_data:
            self._check_fragment(fragment)
        obs_filter = self.obs_filter
        if obs_filter is not None and fragment.filtered is not None:
            filter_fragment(fragment.columns, fragment.filtered, obs_filter)
        self.steps_sampled += self.fragment_length * len(self.envs)
        hooks = self.hooks
        if hooks is not None:  # the episodes that passed the fragment's checks count: they end now
            published = hooks.publish([episode_id for episode_id, _ in fragment.finished])
            for (_, stats), metrics in zip(fragment.finished, published):
                stats.custom_metrics = metrics
        self.finished.extend(stats for _, stats in fragment.finished)
        if self.output is not None:
            self.output(fragment.whole())
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
        fragment.end_row(step, i)
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
                fragment.end_row(step, i)
                self._discard_episode(fragment, i, step)
            self._start_episode(i, None, step + 1, full=True)

    def _problem(self, value: Any, field: str) -> str:
        return self._obs_check.value_problem(value, field) or f"{field}={abbreviate(value)}"

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
        if self.recurrent is not None:
            self.recurrent.reset(i)

    def _start_episode(self, i: int, seed: int | None, row: int, *, full: bool = False) -> None:
        """Reset env ``i`` for a new episode starting at ``row`` of the fragment (``fragment_length``: the next one)."""
        self.episode_rewards[i] = 0.0
        self.ts[i] = 0
        self.eps_ids[i] = self._new_episode_id()
        if self.recurrent is not None:
            self.recurrent.reset(i)
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
            self.masks.read(i, raw, info)
            obs = raw if self._flatten is None else self._flatten(raw)
            if not self._check_data:
                return obs, raw, info
            problem = self.masks.empty_problem(i, "obs")  # the episode's first state needs a legal action
            if problem is None and not full:
                rows = self.obs
                if obs.__class__ is np.ndarray and obs.shape == rows.shape[1:] and obs.dtype is rows.dtype:
                    return obs, raw, info  # the right form; its values are checked with the step's and the fragment's
            if problem is None:
                check = self._obs_check
                problem = check.problem(obs, "obs") if full else check.form_problem(obs, "obs")
            if problem is None:
                return obs, raw, info
            self._bad_data(i, f"env.reset() (vector step {self._vector_step(row)})", problem)
            seed = None

    def _check_fragment(self, fragment: _Fragment) -> None:
        """Check the fragment's rewards, final observations and bounds; drop (or raise for) the episodes at fault."""
        columns = fragment.columns
        for step, i, problem in bad_rows(columns, fragment.keep, self._obs_check):
            vector_step = self._vector_step(step)
            if problem is not None:
                t = int(columns[SampleBatch.T][step, i])
                self._bad_data(i, f"env.step() at step {t} of its episode (vector step {vector_step})", problem)
            else:  # the row's obs, the first of its episode
                obs = columns[SampleBatch.OBS][step, i]
                self._bad_data(i, f"env.reset() (vector step {vector_step})", self._problem(obs, "obs"))
            if self._discard_episode(fragment, i, step):
                self._start_episode(i, None, len(fragment.keep), full=True)

    def _discard_episode(self, fragment: _Fragment, i: int, step: int) -> bool:
        """Drop env ``i``'s episode holding row ``step``: its rows, carried pieces and statistics.

        Returns whether that episode is still running at the end of the fragment.
        """
        eps_id, running = fragment.drop_episode(step, i)
        carry = self._carry[i]
        if carry and int(carry[0][SampleBatch.EPS_ID][0]) == eps_id:
            self._carry[i] = []
        return running
