"""Stepping a set of envs with one batched policy forward pass per vector step.

The sampler writes each step into preallocated ``[T, num_envs, ...]`` arrays, then cuts
every env's column into trajectory pieces (one per episode part), postprocesses each
piece with the policy (advantages, n-step returns, ...) and concatenates them.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from flowrl.data import SampleBatch, concat_samples
from flowrl.policy import Policy

BATCH_MODES = ("truncate_episodes", "complete_episodes")
#: Finished episodes a sampler keeps until they are collected (a worker nobody asks must not grow).
MAX_UNCOLLECTED_EPISODES = 10_000


@dataclass
class EpisodeStats:
    """Return and length (env steps) of one finished episode.

    In multi-agent episodes ``episode_reward`` sums every agent's rewards and
    ``policy_rewards`` lists each agent's return under the id of the policy it acted with.
    """

    episode_reward: float
    episode_length: int
    policy_rewards: dict[str, list[float]] = field(default_factory=dict)


class VectorSampler:
    """Samples fragments from ``envs`` with ``policy``.

    ``truncate_episodes``: each :meth:`sample` returns exactly ``fragment_length`` steps
    per env; episodes running at the end are cut (and bootstrapped by postprocessing).
    ``complete_episodes``: only whole episodes are returned, at least
    ``fragment_length * num_envs`` steps; unfinished ones carry over to the next call.
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
    ) -> None:
        if batch_mode not in BATCH_MODES:
            raise ValueError(f"batch_mode={batch_mode!r} is not one of {BATCH_MODES}")
        self.envs = envs
        self.policy = policy
        self.fragment_length = fragment_length
        self.batch_mode = batch_mode
        space = envs[0].action_space
        self._clip = (space.low, space.high) if clip_actions and isinstance(space, gym.spaces.Box) else None
        n = len(envs)
        self._next_episode_id = episode_id_base
        self.eps_ids = np.array([self._new_episode_id() for _ in range(n)], dtype=np.int64)
        self.ts = np.zeros(n, dtype=np.int64)
        self.episode_rewards = np.zeros(n, dtype=np.float64)
        observations = [env.reset(seed=None if seed is None else seed + i)[0] for i, env in enumerate(envs)]
        self.obs = np.stack(observations)
        # Bounded: a worker whose statistics nobody collects must not grow without limit.
        self.finished: collections.deque[EpisodeStats] = collections.deque(maxlen=MAX_UNCOLLECTED_EPISODES)
        self._carry: list[list[SampleBatch]] = [[] for _ in range(n)]
        self.steps_sampled = 0

    def _new_episode_id(self) -> int:
        self._next_episode_id += 1
        return self._next_episode_id

    def sample(self) -> SampleBatch:
        """One fragment: ``fragment_length`` steps per env, postprocessed."""
        if self.batch_mode == "truncate_episodes":
            pieces = self._run()
            return concat_samples([self.policy.postprocess_trajectory(p) for p in pieces])
        done: list[SampleBatch] = []
        target = self.fragment_length * len(self.envs)
        while sum(b.count for b in done) < target:
            for piece in self._run():
                env_index = int(piece[SampleBatch.ENV_ID][0])
                self._carry[env_index].append(piece)
                last = len(piece) - 1
                if piece[SampleBatch.TERMINATEDS][last] or piece[SampleBatch.TRUNCATEDS][last]:
                    episode = concat_samples(self._carry[env_index])
                    self._carry[env_index] = []
                    done.append(self.policy.postprocess_trajectory(episode))
        return concat_samples(done)

    def _run(self) -> list[SampleBatch]:
        """Step every env ``fragment_length`` times; return per-env trajectory pieces."""
        T, n = self.fragment_length, len(self.envs)
        obs_buf = np.empty((T, *self.obs.shape), dtype=self.obs.dtype)
        new_obs_buf = np.empty_like(obs_buf)
        rewards = np.empty((T, n), dtype=np.float32)
        terminateds = np.empty((T, n), dtype=bool)
        truncateds = np.empty((T, n), dtype=bool)
        eps_ids = np.empty((T, n), dtype=np.int64)
        ts = np.empty((T, n), dtype=np.int64)
        actions_buf: np.ndarray | None = None
        extra_bufs: dict[str, np.ndarray] = {}
        for step in range(T):
            actions, extra = self.policy.compute_actions(self.obs)
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
            # Write each result straight into the step's rows: no per-step lists or stacking.
            new_obs, step_rewards = new_obs_buf[step], rewards[step]
            step_terms, step_truncs = terminateds[step], truncateds[step]
            for i, env in enumerate(self.envs):
                new_obs[i], step_rewards[i], step_terms[i], step_truncs[i], _ = env.step(env_actions[i])
            self.obs[:] = new_obs
            self.episode_rewards += step_rewards
            self.ts += 1
            for env_index in np.flatnonzero(step_terms | step_truncs):
                self.finished.append(EpisodeStats(float(self.episode_rewards[env_index]), int(self.ts[env_index])))
                self.episode_rewards[env_index] = 0.0
                self.ts[env_index] = 0
                self.eps_ids[env_index] = self._new_episode_id()
                self.obs[env_index] = self.envs[env_index].reset()[0]
        self.steps_sampled += T * n
        assert actions_buf is not None
        columns: dict[str, np.ndarray] = {
            SampleBatch.OBS: obs_buf,
            SampleBatch.NEW_OBS: new_obs_buf,
            SampleBatch.ACTIONS: actions_buf,
            SampleBatch.REWARDS: rewards,
            SampleBatch.TERMINATEDS: terminateds,
            SampleBatch.TRUNCATEDS: truncateds,
            SampleBatch.EPS_ID: eps_ids,
            SampleBatch.T: ts,
            **extra_bufs,
        }
        return self._pieces(columns)

    def _pieces(self, columns: dict[str, np.ndarray]) -> list[SampleBatch]:
        """Cut ``[T, n]`` columns into one batch per env and episode part."""
        T, n = self.fragment_length, len(self.envs)
        ends = columns[SampleBatch.TERMINATEDS] | columns[SampleBatch.TRUNCATEDS]
        pieces: list[SampleBatch] = []
        for i in range(n):
            env_columns: dict[str, Any] = {k: v[:, i] for k, v in columns.items()}
            env_columns[SampleBatch.ENV_ID] = np.full(T, i, dtype=np.int64)
            bounds = [0, *(np.flatnonzero(ends[:, i]) + 1).tolist()]
            if bounds[-1] != T:
                bounds.append(T)
            for start, stop in zip(bounds[:-1], bounds[1:]):
                pieces.append(SampleBatch({k: v[start:stop] for k, v in env_columns.items()}))
        return pieces

    def pop_episode_stats(self) -> list[EpisodeStats]:
        """Episodes finished since the last call (the most recent ones, if very many)."""
        finished = list(self.finished)
        self.finished.clear()
        return finished
