"""Stepping multi-agent envs (PettingZoo's Parallel API) with one batched forward pass per policy per step.

Each agent is mapped to a policy once per episode by ``policy_mapping_fn(agent_id)``. At
every vector step, the live agents of all envs are grouped by policy and each policy acts
on its group's stacked observations. Every agent's transitions form its own trajectory;
a piece ends when the agent terminates or truncates, or when the fragment ends (then its
policy's postprocessing bootstraps from the last next-observation), and is postprocessed
by that agent's policy. A fragment is a :class:`~flowrl.data.MultiAgentBatch` of
``fragment_length x num_envs`` env steps.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from flowrl.actors.sampler import MAX_UNCOLLECTED_EPISODES, EpisodeStats
from flowrl.data import MultiAgentBatch, SampleBatch, concat_samples
from flowrl.errors import EnvError, FlowRLError
from flowrl.policy import Policy
from flowrl.policy.mapping import PolicyMappingFn


class _Trajectory:
    """The rows of one agent's current trajectory piece."""

    def __init__(self, policy_id: str, agent_index: int, env_index: int, eps_id: int) -> None:
        self.policy_id = policy_id
        self.agent_index = agent_index
        self.env_index = env_index
        self.eps_id = eps_id
        self.columns: dict[str, list[Any]] = collections.defaultdict(list)
        self.total_reward = 0.0
        # Rewards the env gave the agent on steps it did not act in (e.g. the step it joined):
        # they go into its next row.
        self.pending_reward = 0.0

    def add(self, row: dict[str, Any]) -> None:
        self.total_reward += float(row[SampleBatch.REWARDS])
        row[SampleBatch.REWARDS] += self.pending_reward
        self.pending_reward = 0.0
        for key, value in row.items():
            self.columns[key].append(value)

    def reward_without_acting(self, reward: float) -> None:
        self.total_reward += reward
        self.pending_reward += reward

    def cut(self) -> SampleBatch | None:
        """The rows so far as a batch (None if there are none); the piece starts afresh."""
        if not self.columns:
            return None
        n = len(self.columns[SampleBatch.REWARDS])
        batch = SampleBatch({k: np.asarray(v) for k, v in self.columns.items()})
        batch[SampleBatch.REWARDS] = batch[SampleBatch.REWARDS].astype(np.float32)
        batch[SampleBatch.EPS_ID] = np.full(n, self.eps_id, dtype=np.int64)
        batch[SampleBatch.ENV_ID] = np.full(n, self.env_index, dtype=np.int64)
        batch[SampleBatch.AGENT_INDEX] = np.full(n, self.agent_index, dtype=np.int64)
        self.columns = collections.defaultdict(list)
        return batch


class MultiAgentSampler:
    """Samples :class:`~flowrl.data.MultiAgentBatch` fragments from multi-agent ``envs``.

    ``policy_map`` holds the policies by id; ``policy_mapping_fn(agent_id)`` picks one for
    each agent at the start of its episode, and an id that is not in ``policy_map`` raises
    a :class:`~flowrl.errors.FlowRLError` naming the agent. Only ``truncate_episodes``
    sampling: each :meth:`sample` steps every env ``fragment_length`` times.
    """

    def __init__(
        self,
        envs: list[Any],
        policy_map: Mapping[str, Policy],
        policy_mapping_fn: PolicyMappingFn,
        *,
        fragment_length: int,
        seed: int | None = None,
        episode_id_base: int = 0,
        clip_actions: bool = True,
    ) -> None:
        self.envs = envs
        self.policy_map = policy_map
        self.policy_mapping_fn = policy_mapping_fn
        self.fragment_length = fragment_length
        self._clip = {
            pid: (p.action_space.low, p.action_space.high)
            for pid, p in policy_map.items()
            if clip_actions and isinstance(p.action_space, gym.spaces.Box)
        }
        self._agent_index = {agent: i for i, agent in enumerate(envs[0].possible_agents)}
        self._next_episode_id = episode_id_base
        n = len(envs)
        self.finished: collections.deque[EpisodeStats] = collections.deque(maxlen=MAX_UNCOLLECTED_EPISODES)
        self.steps_sampled = 0
        self.obs: list[dict[Hashable, Any]] = [{} for _ in envs]
        self.ts = np.zeros(n, dtype=np.int64)
        self.eps_ids = np.zeros(n, dtype=np.int64)
        self.trajectories: list[dict[Hashable, _Trajectory]] = [{} for _ in range(n)]
        for i, env in enumerate(envs):
            self._start_episode(i, None if seed is None else seed + i)

    def _start_episode(self, i: int, seed: int | None = None) -> None:
        obs, _ = self.envs[i].reset(seed=seed)
        self.obs[i] = dict(obs)
        self.ts[i] = 0
        self._next_episode_id += 1
        self.eps_ids[i] = self._next_episode_id
        self.trajectories[i] = {}

    def _trajectory(self, i: int, agent: Hashable) -> _Trajectory:
        trajectory = self.trajectories[i].get(agent)
        if trajectory is None:
            policy_id = self.policy_mapping_fn(agent)
            if policy_id not in self.policy_map:
                raise FlowRLError(
                    f"policy_mapping_fn({agent!r}) returned {policy_id!r}, which is not a policy; "
                    f"the policies are {sorted(self.policy_map)}"
                )
            if agent not in self._agent_index:
                raise EnvError(f"agent {agent!r} is not one of the env's possible_agents {list(self._agent_index)}")
            trajectory = _Trajectory(policy_id, self._agent_index[agent], i, int(self.eps_ids[i]))
            self.trajectories[i][agent] = trajectory
        return trajectory

    def sample(self) -> MultiAgentBatch:
        """One fragment: ``fragment_length`` steps of every env, postprocessed per agent trajectory."""
        pieces: dict[str, list[SampleBatch]] = collections.defaultdict(list)

        def close(trajectory: _Trajectory) -> None:
            piece = trajectory.cut()
            if piece is not None:
                pieces[trajectory.policy_id].append(self.policy_map[trajectory.policy_id].postprocess_trajectory(piece))

        for _ in range(self.fragment_length):
            self._step(close)
        for env_trajectories in self.trajectories:
            for trajectory in env_trajectories.values():
                close(trajectory)
        env_steps = self.fragment_length * len(self.envs)
        self.steps_sampled += env_steps
        batches = {pid: concat_samples(batches) if len(batches) > 1 else batches[0] for pid, batches in pieces.items()}
        return MultiAgentBatch(batches, env_steps)

    def _step(self, close: Callable[[_Trajectory], None]) -> None:
        # Group every live agent of every env by its policy, so each policy acts once.
        groups: dict[str, list[tuple[int, Hashable]]] = collections.defaultdict(list)
        for i, env_obs in enumerate(self.obs):
            for agent in env_obs:
                groups[self._trajectory(i, agent).policy_id].append((i, agent))
        actions: list[dict[Hashable, Any]] = [{} for _ in self.envs]
        rows: dict[tuple[int, Hashable], dict[str, Any]] = {}
        for policy_id, members in groups.items():
            obs_batch = np.stack([np.asarray(self.obs[i][agent]) for i, agent in members])
            policy_actions, extra = self.policy_map[policy_id].compute_actions(obs_batch)
            clip = self._clip.get(policy_id)
            for k, (i, agent) in enumerate(members):
                action = policy_actions[k]
                actions[i][agent] = np.clip(action, *clip) if clip is not None else action
                rows[(i, agent)] = {SampleBatch.OBS: obs_batch[k], SampleBatch.ACTIONS: action, **{key: v[k] for key, v in extra.items()}}
        for i, env in enumerate(self.envs):
            new_obs, rewards, terminateds, truncateds, _ = env.step(actions[i])
            t = int(self.ts[i])
            for agent in actions[i]:
                row = rows[(i, agent)]
                terminated, truncated = bool(terminateds.get(agent, False)), bool(truncateds.get(agent, False))
                row.update({
                    SampleBatch.REWARDS: float(rewards.get(agent, 0.0)),
                    SampleBatch.NEW_OBS: np.asarray(new_obs.get(agent, row[SampleBatch.OBS])),
                    SampleBatch.TERMINATEDS: terminated,
                    SampleBatch.TRUNCATEDS: truncated,
                    SampleBatch.T: t,
                })
                trajectory = self.trajectories[i][agent]
                trajectory.add(row)
                if terminated or truncated:
                    close(trajectory)
            for agent, reward in rewards.items():
                if agent not in actions[i]:
                    self._trajectory(i, agent).reward_without_acting(float(reward))
            self.ts[i] += 1
            live = list(env.agents)
            if live:
                missing = [agent for agent in live if agent not in new_obs]
                if missing:
                    raise EnvError(f"{type(env).__name__}.step() returned no observation for live agent(s) {missing}")
                self.obs[i] = {agent: new_obs[agent] for agent in live}
                continue
            # Every agent is done: the episode is over.
            for trajectory in self.trajectories[i].values():
                if trajectory.columns:  # an agent the env dropped without a done flag: its piece ends here
                    trajectory.columns[SampleBatch.TRUNCATEDS][-1] = True
                    trajectory.columns[SampleBatch.REWARDS][-1] += trajectory.pending_reward
                    close(trajectory)
            self._record_episode(i)
            self._start_episode(i)

    def _record_episode(self, i: int) -> None:
        policy_rewards: dict[str, list[float]] = collections.defaultdict(list)
        for trajectory in self.trajectories[i].values():  # one per agent of the episode: its return so far
            policy_rewards[trajectory.policy_id].append(trajectory.total_reward)
        total_reward = sum(sum(returns) for returns in policy_rewards.values())
        self.finished.append(EpisodeStats(float(total_reward), int(self.ts[i]), dict(policy_rewards)))

    def pop_episode_stats(self) -> list[EpisodeStats]:
        """Episodes finished since the last call (the most recent ones, if very many)."""
        finished = list(self.finished)
        self.finished.clear()
        return finished
