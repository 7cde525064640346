"""Stepping multi-agent envs (PettingZoo's Parallel API) with one batched forward pass per policy per step.

Each agent is mapped to a policy once per episode by ``policy_mapping_fn(agent_id)``. At
every vector step, the acting agents of all envs (the live ones; in a turn-based env the one whose
turn it is, see :func:`~flowrl.envs.multi_agent.acting_agents`) are grouped by policy and each
policy acts on its group's stacked observations, within each agent's action mask. Every agent's
transitions form its own trajectory. A row (an observation and the action taken on it) is complete
when the agent acts again or finishes: its next observation is the one it then has, its reward all
it earned in between (in a turn-based game, the other players' moves included), and its flags those
of its last step. A piece ends when the agent terminates or truncates, or when the fragment ends
(then its policy's postprocessing bootstraps from the last next-observation; a row still waiting
for the agent's next turn goes into the next fragment), and is postprocessed by that agent's policy.
A fragment is a :class:`~flowrl.data.MultiAgentBatch` of ``fragment_length x num_envs`` env steps,
less the steps of episodes dropped for a fault (see
:class:`~flowrl.actors.sampling.recovery.FaultTolerantSampler`).
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from flowrl.actors.sampling.agent_trajectory import AgentTrajectory, recurrent_inputs
from flowrl.actors.sampling.checks import ObservationCheck, reward_problem
from flowrl.actors.sampling.episode_hooks import EpisodeHooks
from flowrl.actors.sampling.masks import AgentMasks
from flowrl.actors.sampling.recovery import EnvMaker, EpisodeStats, FaultTolerantSampler, no_clock
from flowrl.data import MultiAgentBatch, SampleBatch, concat_samples
from flowrl.data.sequences import chop_into_sequences
from flowrl.envs.flatten import mask_field, no_legal_action
from flowrl.envs.multi_agent import acting_agents
from flowrl.errors import EnvError, FlowRLError
from flowrl.policy.mapping import PolicyMappingFn
from flowrl.policy.protocols import AgentPolicy


@dataclass
class _Fragment:
    """What one :meth:`MultiAgentSampler.sample` call gathered: postprocessed pieces and the episodes dropped."""

    #: Per policy id: ``(episode id, piece)``, so that a piece of an episode dropped later can be left out.
    pieces: dict[str, list[tuple[int, SampleBatch]]] = field(default_factory=lambda: collections.defaultdict(list))
    dropped: set[int] = field(default_factory=set)
    dropped_env_steps: int = 0


class MultiAgentSampler(FaultTolerantSampler):
    """Samples :class:`~flowrl.data.MultiAgentBatch` fragments from multi-agent ``envs``.

    ``policy_map`` holds the policies by id; ``policy_mapping_fn(agent_id)`` picks one for
    each agent at the start of its episode, and an id that is not in ``policy_map`` raises
    a :class:`~flowrl.errors.FlowRLError` naming the agent. Only ``truncate_episodes``
    sampling: each :meth:`sample` steps every env ``fragment_length`` times.

    Faults are handled per env as in :class:`~flowrl.actors.sampling.recovery.FaultTolerantSampler`
    (an episode is dropped for all of its agents). Each agent's observations are checked
    against ``observation_space(agent)``; the live agents' ones as each policy's stacked
    batch, in a few vectorized passes (agents that share a policy share its space), and a
    leaving agent's last one alone. Rewards are checked per env step. An agent's Dict or Tuple
    observations are flattened (see :mod:`flowrl.envs.flatten`) before they are checked and stacked.

    ``hooks`` runs the callbacks' episode hooks as in
    :class:`~flowrl.actors.sampling.recovery.FaultTolerantSampler`; an episode ends, and is published, at
    the step its last agent is done.

    Action masks (agents of a Discrete action space whose observation, a masked Dict, or info holds
    ``"action_mask"``; see :mod:`flowrl.envs.flatten`): each policy acts within its agents' masks, and
    once any mask has been seen the rows of Discrete policies hold the ``action_mask`` of their
    observation and the ``next_action_mask`` of their next one (all legal for an agent without a mask).
    An acting agent's mask that allows no action is a bad observation (an agent that does not act, such
    as a turn-based game's waiting player, may have one).

    A recurrent policy's agents each carry their own state (see
    :class:`~flowrl.actors.sampling.agent_trajectory.AgentTrajectory`), from the initial one at the start of
    each agent's episode; its pieces are cut into sequences of ``max_seq_len`` after postprocessing.
    """

    def __init__(
        self,
        envs: list[Any],
        policy_map: Mapping[str, AgentPolicy],
        policy_mapping_fn: PolicyMappingFn,
        *,
        fragment_length: int,
        seed: int | None = None,
        episode_id_base: int = 0,
        clip_actions: bool = True,
        env_maker: EnvMaker | None = None,
        on_bad_observation: str = "raise",
        worker_index: int = 0,
        hooks: EpisodeHooks | None = None,
    ) -> None:
        super().__init__(
            envs,
            env_maker=env_maker,
            on_bad_observation=on_bad_observation,
            worker_index=worker_index,
            seed=seed,
            hooks=hooks,
        )
        self.policy_map = policy_map
        self.policy_mapping_fn = policy_mapping_fn
        self.fragment_length = fragment_length
        self._clip = {
            pid: (p.action_space.low, p.action_space.high)
            for pid, p in policy_map.items()
            if clip_actions and isinstance(p.action_space, gym.spaces.Box)
        }
        self._agent_index = {agent: i for i, agent in enumerate(envs[0].possible_agents)}
        self._agents = list(envs[0].possible_agents)
        # Duck-typed stand-ins written before recurrent policies have no state.
        self._initial_states: dict[str, list[np.ndarray]] = {
            pid: getattr(p, "get_initial_state", list)() for pid, p in policy_map.items()
        }
        self._obs_checks: dict[Hashable, ObservationCheck] = {}
        # Only envs with an agent of a Dict or Tuple space pay for a look at every observation.
        self._structured = any(self._obs_check(0, agent).flatten is not None for agent in envs[0].possible_agents)
        #: Checks on (the default); benchmarks/sampler_checks.py turns them off to measure their cost.
        self._check_data = True
        self._next_episode_id = episode_id_base
        n = len(envs)
        self.steps_sampled = 0
        #: Called after each vector step (a rollout worker counts its progress with it).
        self.on_step: Callable[[], object] = no_clock
        self.masks = AgentMasks(envs[0], n, worker_index)
        self.obs: list[dict[Hashable, Any]] = [{} for _ in envs]
        #: Per env, the agents that act at its next step (its live agents, or a turn-based env's mover).
        self.acting: list[list[Hashable]] = [[] for _ in envs]
        self.ts = np.zeros(n, dtype=np.int64)
        self.eps_ids = np.zeros(n, dtype=np.int64)
        self.trajectories: list[dict[Hashable, AgentTrajectory]] = [{} for _ in range(n)]
        for i in range(n):
            self._start_episode(i, None if seed is None else seed + i)
        # Whether this fragment's rows of Discrete policies hold mask columns: fixed per fragment, so that
        # its pieces concatenate (a mask first seen in a step's info adds them from the next fragment on).
        self._mask_rows = self.masks.masked
        # The acting agents grouped by policy with their stacked, checked observations and their masks (None:
        # unmasked): what acts next.
        self._groups: dict[str, tuple[list[tuple[int, Hashable]], np.ndarray, np.ndarray | None]] = {}
        self._prepare_groups(_Fragment(), -1)

    STATE_ATTRS = FaultTolerantSampler.STATE_ATTRS + (
        "_next_episode_id",
        "steps_sampled",
        "masks",
        "obs",
        "acting",
        "ts",
        "eps_ids",
        "trajectories",
    )

    def set_state(self, state: Mapping[str, Any]) -> list[int]:
        fresh = super().set_state(state)
        self._prepare_groups(_Fragment(), -1)  # what acts next: the restored observations
        return fresh

    def _restart_episode(self, index: int) -> None:
        self._start_episode(index, None if self._reseed is None else int(self._reseed.integers(2**31)))

    def _start_episode(self, i: int, seed: int | None = None) -> None:
        while True:
            try:
                obs, info = self.envs[i].reset(seed=seed)
                break
            except Exception as error:
                if self.env_maker is None:
                    raise
                seed = self._recreate_env(i, "env.reset()", error)
        self.masks.clear(i)
        self.masks.read(i, obs, info)
        self.obs[i] = self._flattened(i, obs)
        self.acting[i] = acting_agents(self.envs[i])
        self.ts[i] = 0
        self._next_episode_id += 1
        self.eps_ids[i] = self._next_episode_id
        self.trajectories[i] = {}
        if self.hooks is not None:
            self.hooks.start(i, int(self.eps_ids[i]), obs, info)

    def _flattened(self, i: int, obs: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        """Env ``i``'s observations by agent, those of Dict or Tuple spaces flattened."""
        if not self._structured:
            return dict(obs)
        flat = {}
        for agent, agent_obs in obs.items():
            flatten = self._obs_check(i, agent).flatten
            flat[agent] = agent_obs if flatten is None else flatten(agent_obs)
        return flat

    def _trajectory(self, i: int, agent: Hashable) -> AgentTrajectory:
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
            policy = self.policy_map[policy_id]
            trajectory = AgentTrajectory(
                policy_id,
                self._agent_index[agent],
                i,
                int(self.eps_ids[i]),
                self._initial_states[policy_id],
                policy.action_space,
            )
            self.trajectories[i][agent] = trajectory
        return trajectory

    def sample(self) -> MultiAgentBatch:
        """One fragment: ``fragment_length`` steps of every env, postprocessed per agent trajectory."""
        fragment = _Fragment()
        self._mask_rows = self.masks.masked
        clock = time.perf_counter if self.timed else no_clock
        for step in range(self.fragment_length):
            started, inference = clock(), self.inference_s
            self._step(fragment, step)
            self.env_s += clock() - started - (self.inference_s - inference)
            self.on_step()
        for env_trajectories in self.trajectories:
            for trajectory in env_trajectories.values():
                self._close(fragment, trajectory)
        env_steps = self.fragment_length * len(self.envs)
        self.steps_sampled += env_steps
        batches: dict[str, SampleBatch] = {}
        for pid, pieces in fragment.pieces.items():
            kept = [piece for eps_id, piece in pieces if eps_id not in fragment.dropped]
            if kept:
                batches[pid] = concat_samples(kept) if len(kept) > 1 else kept[0]
        return MultiAgentBatch(batches, env_steps - fragment.dropped_env_steps)

    def _close(self, fragment: _Fragment, trajectory: AgentTrajectory) -> None:
        piece = trajectory.cut()
        if piece is not None:
            policy = self.policy_map[trajectory.policy_id]
            if self.output is not None:
                agent = self._agents[trajectory.agent_index]
                self.output(piece, {SampleBatch.POLICY_ID: trajectory.policy_id, SampleBatch.AGENT_ID: str(agent)})
            piece = policy.postprocess_trajectory(piece)
            if trajectory.state:
                piece = chop_into_sequences(piece, int(getattr(policy, "max_seq_len")))
            fragment.pieces[trajectory.policy_id].append((trajectory.eps_id, piece))

    def _step(self, fragment: _Fragment, step: int) -> None:
        actions: list[dict[Hashable, Any]] = [{} for _ in self.envs]
        started = time.perf_counter() if self.timed else 0.0
        for policy_id, (members, obs_batch, mask_batch) in self._groups.items():
            policy = self.policy_map[policy_id]
            inputs: dict[str, Any] = {} if mask_batch is None else {"action_mask": mask_batch}
            if self._initial_states[policy_id]:
                inputs.update(recurrent_inputs([self.trajectories[i][agent] for i, agent in members]))
            policy_actions, extra = policy.compute_actions(obs_batch, **inputs)
            clip = self._clip.get(policy_id)
            store_masks = self._mask_rows and mask_batch is not None
            for k, (i, agent) in enumerate(members):
                action = policy_actions[k]
                actions[i][agent] = np.clip(action, *clip) if clip is not None else action
                row = {
                    SampleBatch.OBS: obs_batch[k],
                    SampleBatch.ACTIONS: action,
                    SampleBatch.T: int(self.ts[i]),
                    **{key: v[k] for key, v in extra.items()},
                }
                if store_masks:
                    assert mask_batch is not None
                    row[SampleBatch.ACTION_MASK] = mask_batch[k]
                self.trajectories[i][agent].open(row)
        if self.timed:
            self.inference_s += time.perf_counter() - started
        for i, env in enumerate(self.envs):
            try:
                raw_obs, rewards, terminateds, truncateds, infos = env.step(actions[i])
            except Exception as error:
                if self.env_maker is None:
                    raise
                seed = self._recreate_env(i, "env.step()", error)
                self._drop_episode(fragment, i, int(self.ts[i]) + 1, step)
                self._start_episode(i, seed)
                continue
            new_obs = self._flattened(i, raw_obs)
            live = list(env.agents)
            if self._check_data:
                problem = self._step_problem(i, new_obs, rewards, live)
                if problem is not None:
                    self._bad_data(i, self._step_where(i, step), problem)
                    self._drop_episode(fragment, i, int(self.ts[i]) + 1, step)
                    self._start_episode(i)
                    continue
            self.masks.read(i, raw_obs, infos)
            self._follow_step(fragment, i, actions[i], new_obs, rewards, terminateds, truncateds, live)
            self.ts[i] += 1
            if self.hooks is not None:
                self.hooks.step(i, raw_obs, float(sum(rewards.values())), infos)
            if live:
                missing = [agent for agent in live if agent not in new_obs]
                if missing:
                    raise EnvError(f"{type(env).__name__}.step() returned no observation for live agent(s) {missing}")
                self.obs[i] = {agent: new_obs[agent] for agent in live}
                continue
            # Every agent is done: the episode is over.
            for agent, trajectory in self.trajectories[i].items():
                # An agent the env dropped without a done flag: its piece ends here.
                if trajectory.open_row is not None:
                    self._complete(i, agent, trajectory, trajectory.open_row[SampleBatch.OBS], False, True)
                else:
                    trajectory.end_last_row(False, True)
                self._close(fragment, trajectory)
            self._record_episode(i)
            self._episode_kept(i)
            self._start_episode(i)
        self._prepare_groups(fragment, step)

    def _follow_step(
        self,
        fragment: _Fragment,
        i: int,
        acted: Mapping[Hashable, Any],
        new_obs: Mapping[Hashable, Any],
        rewards: Mapping[Hashable, Any],
        terminateds: Mapping[Hashable, Any],
        truncateds: Mapping[Hashable, Any],
        live: list[Hashable],
    ) -> None:
        """Give env ``i``'s step to its agents' trajectories: rewards to the rows they earned them with, and
        the rows of the agents that finished, act next or left complete; set who acts next."""
        trajectories = self.trajectories[i]
        for agent, reward in rewards.items():
            self._trajectory(i, agent).reward(float(reward))
        finished = set()
        for agent in {**terminateds, **truncateds}:
            terminated, truncated = bool(terminateds.get(agent, False)), bool(truncateds.get(agent, False))
            if not (terminated or truncated):
                continue
            finished.add(agent)
            trajectory = trajectories.get(agent)
            if trajectory is None:  # finished without acting or earning anything
                continue
            if trajectory.open_row is not None:
                last_obs = new_obs.get(agent, trajectory.open_row[SampleBatch.OBS])
                self._complete(i, agent, trajectory, last_obs, terminated, truncated)
            else:
                trajectory.end_last_row(terminated, truncated)
            self._close(fragment, trajectory)
        live_set = set(live)
        for agent in acted:
            trajectory = trajectories[agent]
            if agent not in finished and agent not in live_set and trajectory.open_row is not None:
                # Left without a done flag: the row ends with what the step gave (the piece ends with the episode).
                last_obs = new_obs.get(agent, trajectory.open_row[SampleBatch.OBS])
                self._complete(i, agent, trajectory, last_obs, False, False)
        acting = acting_agents(self.envs[i]) if live else []
        for agent in acting:
            trajectory = trajectories.get(agent)
            if trajectory is not None and trajectory.open_row is not None and agent in new_obs:
                self._complete(i, agent, trajectory, new_obs[agent], False, False)
        self.acting[i] = acting

    def _complete(
        self, i: int, agent: Hashable, trajectory: AgentTrajectory, new_obs: Any, terminated: bool, truncated: bool
    ) -> None:
        """Complete ``agent``'s open row, with its next mask where the fragment's rows hold masks."""
        columns = None
        if self._mask_rows:
            next_mask = self.masks.of(i, agent)
            if next_mask is not None:
                assert trajectory.open_row is not None
                # A row opened before the first mask was seen: every action was legal to it.
                trajectory.open_row.setdefault(SampleBatch.ACTION_MASK, np.ones_like(next_mask))
                columns = {SampleBatch.NEXT_ACTION_MASK: next_mask}
        trajectory.complete(new_obs, terminated, truncated, columns)

    def _step_where(self, i: int, step: int) -> str:
        vector_step = self.steps_sampled // len(self.envs) + step
        return f"env.step() at step {int(self.ts[i])} of its episode (vector step {vector_step})"

    def _obs_check(self, i: int, agent: Hashable) -> ObservationCheck:
        check = self._obs_checks.get(agent)
        if check is None:
            space = self.envs[i].observation_space(agent)
            check = self._obs_checks[agent] = ObservationCheck(space, f"observation_space({agent!r})")
        return check

    def _step_problem(
        self, i: int, new_obs: Mapping[Hashable, Any], rewards: Mapping[Hashable, Any], live: list[Hashable]
    ) -> str | None:
        """What is wrong with a step's rewards, or with the last observation of an agent that left; or None.

        (The live agents' observations are checked stacked, by :meth:`_prepare_groups`.)
        """
        try:
            finite = math.isfinite(sum(rewards.values()))  # one sum: finite only if every reward is
        except TypeError:
            finite = False
        if not finite:
            for agent, reward in rewards.items():
                problem = reward_problem(reward, f"reward[{agent!r}]")
                if problem is not None:
                    return problem
        for agent, obs in new_obs.items():
            if agent not in live:
                problem = self._obs_check(i, agent).problem(obs, f"new_obs[{agent!r}]")
                if problem is not None:
                    return problem
        return None

    def _prepare_groups(self, fragment: _Fragment, step: int) -> None:
        """Group the live agents of every env by policy, stack and check their observations (after vector ``step``).

        An env with a bad observation has its episode dropped (or raises) and is reset, and
        the groups are made again.
        """
        while True:
            groups: dict[str, list[tuple[int, Hashable]]] = collections.defaultdict(list)
            for i, env_acting in enumerate(self.acting):
                for agent in env_acting:
                    groups[self._trajectory(i, agent).policy_id].append((i, agent))
            self._groups = {}
            for policy_id, members in groups.items():
                bad = None
                try:
                    obs_batch = np.stack([np.asarray(self.obs[i][agent]) for i, agent in members])
                except ValueError:  # observations of different shapes
                    if not self._check_data or (bad := self._first_bad_observation(members)) is None:
                        raise
                else:
                    if self._check_data and not self._obs_check(*members[0]).rows_ok(obs_batch):
                        bad = self._first_bad_observation(members)  # None: a sum overflowed, all is well
                mask_batch = self.masks.batch(members)
                if bad is None and self._check_data and mask_batch is not None:
                    bad = self._first_empty_mask(members, mask_batch)
                if bad is not None:
                    self._drop_for_observation(fragment, step, *bad)
                    break
                self._groups[policy_id] = (members, obs_batch, mask_batch)
            else:
                return

    def _first_bad_observation(self, members: list[tuple[int, Hashable]]) -> tuple[int, Hashable, str] | None:
        for i, agent in members:
            field = f"{'obs' if self.ts[i] == 0 else 'new_obs'}[{agent!r}]"
            problem = self._obs_check(i, agent).problem(self.obs[i][agent], field)
            if problem is not None:
                return i, agent, problem
        return None

    def _first_empty_mask(
        self, members: list[tuple[int, Hashable]], mask_batch: np.ndarray
    ) -> tuple[int, Hashable, str] | None:
        """The first of ``members`` whose action mask (its row of ``mask_batch``) allows no action, with the problem."""
        empty = np.flatnonzero(~mask_batch.any(axis=1))
        if not len(empty):
            return None
        k = int(empty[0])
        i, agent = members[k]
        obs_field = f"{'obs' if self.ts[i] == 0 else 'new_obs'}[{agent!r}]"
        field = mask_field(self.envs[i].observation_space(agent), obs_field, f"infos[{agent!r}]")
        return i, agent, no_legal_action(mask_batch[k], field)

    def _drop_for_observation(self, fragment: _Fragment, step: int, i: int, agent: Hashable, problem: str) -> None:
        """Raise for, or drop the episode of, env ``i`` whose agent's next observation is bad; start another."""
        vector_step = self.steps_sampled // len(self.envs) + step
        if self.ts[i] == 0:  # from a reset, for the next vector step
            where = f"env.reset() (vector step {vector_step + 1})"
        else:
            where = f"env.step() at step {int(self.ts[i]) - 1} of its episode (vector step {vector_step})"
        self._bad_data(i, where, problem)
        self._drop_episode(fragment, i, int(self.ts[i]), step)
        self._start_episode(i)

    def _drop_episode(self, fragment: _Fragment, i: int, steps_taken: int, step: int) -> None:
        """Leave env ``i``'s episode (``steps_taken`` steps so far) out of the fragment: its pieces and env steps."""
        fragment.dropped.add(int(self.eps_ids[i]))
        fragment.dropped_env_steps += min(steps_taken, step + 1)

    def _record_episode(self, i: int) -> None:
        policy_rewards: dict[str, list[float]] = collections.defaultdict(list)
        for trajectory in self.trajectories[i].values():  # one per agent of the episode: its return so far
            policy_rewards[trajectory.policy_id].append(trajectory.total_reward)
        total_reward = sum(sum(returns) for returns in policy_rewards.values())
        stats = EpisodeStats(float(total_reward), int(self.ts[i]), dict(policy_rewards))
        if self.hooks is not None:
            self.hooks.end(i)
            [stats.custom_metrics] = self.hooks.publish([int(self.eps_ids[i])])
        self.finished.append(stats)
