"""Evaluation episodes: the one loop that plays them, and the workers that play them beside training.

:func:`run_episodes` plays whole episodes with a set of policies (what ``Trainer.evaluate``,
``flowrl evaluate`` and evaluation during training all use). An :class:`EvaluationWorker`
holds its own copies of the run's policies, so that evaluating never touches the learner's;
it runs in the driver or as a Ray actor. :class:`EvaluationWorkers` are
``evaluation_num_workers`` such actors in the run's placement group (one bundle each, see
:func:`evaluation_request`), which split each evaluation round's episodes among them.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, cast

import gymnasium as gym
import numpy as np

from flowrl.actors.placement import BundleRequest, Reservation
from flowrl.actors.rollout_worker import as_config
from flowrl.actors.sampling.recurrent_state import RecurrentState
from flowrl.actors.worker_set import CALL_TIMEOUT_S
from flowrl.config import TrainerConfig
from flowrl.data import DEFAULT_POLICY_ID
from flowrl.deferred import ray, torch
from flowrl.envs import acting_agents, is_multi_agent_env
from flowrl.envs.context import EnvContext
from flowrl.envs.episodes import run_episode
from flowrl.envs.flatten import action_mask_of, flatten_observation, legal_actions, mask_field
from flowrl.envs.registry import EnvCreator, close_env
from flowrl.envs.video import missing_renderer_reported, record_episodes, rendering_env_config, video_files
from flowrl.errors import ResourceUnavailableError
from flowrl.policy import Policy, PolicySpec
from flowrl.policy.filters import MeanStdFilter, RunningStats
from flowrl.policy.mapping import policy_mapping
from flowrl.policy.policy import ModelWeights

logger = logging.getLogger(__name__)

EVALUATION_WORKER = "evaluation_worker"  # the role of evaluation actors in the run's reservation


def evaluation_settings(config: TrainerConfig) -> TrainerConfig:
    """The config evaluation runs with: ``config`` with ``evaluation_config`` applied."""
    return config.replace(**config.evaluation_config) if config.evaluation_config else config


def evaluation_explores(config: TrainerConfig) -> bool:
    """Whether evaluation samples actions: only when ``evaluation_config`` sets ``explore: True``.

    Not a key of :func:`evaluation_settings`: a composed algorithm (``ppo_dqn``) keeps ``explore``
    per policy, and evaluation acts greedily whatever the training does.
    """
    return bool(config.evaluation_config.get("explore", False))


def evaluation_request(config: TrainerConfig) -> BundleRequest:
    """One bundle per evaluation actor (``evaluation_num_workers``; none while evaluation is off),
    of the evaluation's ``num_cpus_per_worker`` CPUs."""
    count = config.evaluation_num_workers if config.evaluation_interval else 0
    key = "num_cpus_per_worker"
    if key in config.evaluation_config:
        key = f"evaluation_config[{key!r}]"
    cpus = evaluation_settings(config).num_cpus_per_worker if count else 0.0
    return BundleRequest(EVALUATION_WORKER, count, {"CPU": cpus}, {"CPU": key}, count_key="evaluation_num_workers")


def episode_seeds(seed: int | None, num_episodes: int) -> list[int | None]:
    """Episode i resets with ``seed + i`` (all None for an unseeded evaluation)."""
    return [None if seed is None else seed + i for i in range(num_episodes)]


def run_episodes(
    policy_map: Mapping[str, Policy[Any]],
    env_creator: EnvCreator,
    config: TrainerConfig,
    seeds: Sequence[int | None],
    *,
    explore: bool = False,
    video_dir: str | Path | None = None,
    record: int = 0,
    obs_filter: MeanStdFilter | None = None,
) -> list[dict[str, Any]]:
    """Play one episode per entry of ``seeds`` (reset with it; None: unseeded) in one env made here.

    A Gymnasium env acts with ``default_policy``; in a multi-agent env each agent acts with the
    policy ``config.policy_mapping_fn`` maps it to. ``explore=False``: deterministic actions.
    Actions honour action masks as sampling does (a masked Dict observation's, or
    ``info["action_mask"]``; see :mod:`flowrl.envs.flatten`). With ``video_dir``, the first
    ``record`` episodes are written there as MP4 files (:func:`flowrl.envs.video.record_episodes`).
    Returns each episode's ``episode_reward``, ``episode_length`` and, multi-agent,
    ``policy_rewards`` (policy id -> its agents' returns). ``obs_filter``: the run's observation
    filter, which observations go through (its statistics frozen) once their mask is split off and
    they are flattened.
    """
    directory = video_dir if record > 0 else None
    env_config = dict(config.env_config)
    if directory is not None:
        env_config = rendering_env_config(env_creator, env_config)
    instance: Any = env_creator(EnvContext(env_config))
    closed = False
    try:
        with missing_renderer_reported():
            if directory is not None:
                instance = record_episodes(instance, directory, record)
            if is_multi_agent_env(instance):
                mapping = policy_mapping(config.policy_mapping_fn, list(policy_map))
                episodes = [_multi_agent_episode(instance, policy_map, mapping, seed, explore) for seed in seeds]
            else:
                policy = policy_map[DEFAULT_POLICY_ID]
                env = cast(gym.Env, instance)  # not multi-agent, so a Gymnasium env
                memory = _memory(policy)

                def act(obs: Any, info: Any) -> Any:
                    return _policy_action(policy, obs, info, explore, obs_filter, memory)

                def observe(reward: float, ended: bool) -> None:
                    if memory is not None:
                        _observe(memory, reward, ended)

                episodes = []
                for seed in seeds:
                    if memory is not None:
                        memory.reset(0)
                    total, length = run_episode(env, act, seed, on_step=observe)
                    episodes.append({"episode_reward": total, "episode_length": length})
            if directory is not None:
                closed = True
                instance.close()  # writes the last recording: its errors must not pass unseen
    finally:
        if not closed:
            close_env(instance)
    return episodes


def _memory(policy: Policy[Any]) -> RecurrentState | None:
    """What a recurrent policy carries through one agent's episode (its state, previous action and
    reward), at an episode's start; None for a feed-forward policy."""
    initial = policy.get_initial_state()
    return RecurrentState(initial, 1, policy.action_space) if initial else None


def _observe(memory: RecurrentState, reward: float, ended: bool) -> None:
    """After a step: its reward is the previous reward of the next; an episode that ended resets the state,
    as the samplers reset it at every episode start."""
    memory.prev_rewards[0] = reward
    if ended:
        memory.reset(0)


def _policy_action(
    policy: Policy[Any],
    obs: Any,
    info: Any,
    explore: bool = False,
    obs_filter: MeanStdFilter | None = None,
    memory: RecurrentState | None = None,
) -> Any:
    """``policy``'s action for one observation as the env returned it, with its ``info``, as the samplers act.

    For a Discrete action space the action is a legal one: by the observation's own action mask (a
    masked Dict) or else ``info["action_mask"]`` (see :mod:`flowrl.envs.flatten`); a mask of the wrong
    form raises :class:`~flowrl.errors.EnvError`. The mask is split off and the observation flattened
    before ``obs_filter`` (the run's observation filter, its statistics frozen) normalizes it. A recurrent
    policy acts from ``memory`` (see :func:`_memory`), which moves on to the next state and this action.
    """
    space, legal = policy.action_space, None
    if isinstance(space, gym.spaces.Discrete):
        mask = action_mask_of(obs, info)
        legal = None if mask is None else legal_actions(mask, int(space.n), mask_field(policy.observation_space, "obs"))
    row = np.asarray(flatten_observation(policy.observation_space, obs))[None]
    if obs_filter is not None:
        row = obs_filter(row, update=False)
    mask = None if legal is None else legal[None]
    if memory is None:
        actions, _ = policy.compute_actions(row, explore=explore, action_mask=mask)
        return actions[0]
    actions, extra = policy.compute_actions(
        row,
        explore=explore,
        action_mask=mask,
        state=memory.states,
        prev_actions=memory.prev_actions,
        prev_rewards=memory.prev_rewards,
    )
    memory.advance(extra, actions, memory.prev_rewards)  # the step's reward comes with _observe
    return actions[0]


def _multi_agent_episode(
    env: Any, policy_map: Mapping[str, Policy[Any]], mapping: Callable[[Any], str], seed: int | None, explore: bool
) -> dict[str, Any]:
    obs, infos = env.reset(seed=seed)
    policy_ids = {agent: mapping(agent) for agent in env.possible_agents}
    returns: dict[Any, float] = {}
    # A recurrent policy's agents each carry their own state from their first action on; the previous reward
    # of an agent's action is all it earned since its last one (a turn-based game's other moves included).
    memories: dict[Any, RecurrentState | None] = {}
    length = 0
    while env.agents:
        # Only the acting agents (a turn-based env's mover), each within its observation's or info's action mask.
        actions = {}
        for agent in acting_agents(env):
            policy = policy_map[policy_ids[agent]]
            memory = memories[agent] = memories[agent] if agent in memories else _memory(policy)
            actions[agent] = _policy_action(policy, obs[agent], infos.get(agent), explore, memory=memory)
        obs, rewards, _, _, infos = env.step(actions)
        for agent, reward in rewards.items():
            returns[agent] = returns.get(agent, 0.0) + float(reward)
            memory = memories.get(agent)
            if memory is not None:
                memory.prev_rewards[0] = float(reward) + (0.0 if agent in actions else memory.prev_rewards[0])
        length += 1
    policy_rewards: dict[str, list[float]] = {}
    for agent, total in returns.items():
        policy_rewards.setdefault(policy_ids[agent], []).append(total)
    return {"episode_reward": sum(returns.values()), "episode_length": length, "policy_rewards": policy_rewards}


class EvaluationOutput(NamedTuple):
    """What evaluating gave: the episodes played (see :func:`run_episodes`) and the MP4 of the first, if recorded."""

    episodes: list[dict[str, Any]]
    video: bytes | None = None


class EvaluationWorker:
    """Its own copies of the run's policies, which play evaluation episodes with the weights last set.

    A plain object in the driver or a Ray actor (``worker_index`` >= 1). ``config`` is the
    evaluation's (:func:`evaluation_settings`): its ``env_config`` and ``policy_mapping_fn`` are
    used. ``explore``: sample actions instead of taking the most likely (:func:`evaluation_explores`).
    """

    def __init__(
        self,
        *,
        env_creator: EnvCreator,
        policy_specs: Mapping[str, PolicySpec],
        config: TrainerConfig | Mapping[str, Any],
        explore: bool = False,
        worker_index: int = 0,
    ) -> None:
        if worker_index > 0:
            torch.set_num_threads(1)  # an actor of a fraction of a CPU: oversubscribed threads only slow it down
        self.config = as_config(config)
        self.explore = explore
        self.worker_index = worker_index
        self._env_creator = env_creator
        with torch.random.fork_rng(devices=[]):  # in the driver, building them must not move training's random stream
            self.policy_map = {pid: spec.build() for pid, spec in policy_specs.items()}
        self.obs_filter: MeanStdFilter | None = None

    def set_filter(self, stats: RunningStats | None) -> None:
        """Filter observations with the run's observation statistics (``None``: the run has no filter)."""
        if stats is None:
            self.obs_filter = None
            return
        self.obs_filter = MeanStdFilter()
        self.obs_filter.sync(stats)

    def set_weights(self, weights: Mapping[str, ModelWeights], global_vars: Mapping[str, Any] | None = None) -> None:
        """Load weights per policy id (the learner's, as rollout workers get them), then ``global_vars``."""
        for pid, policy_weights in weights.items():
            self.policy_map[pid].set_weights(policy_weights)
        if global_vars is not None:
            for policy in self.policy_map.values():
                policy.on_global_var_update(global_vars)

    def evaluate(self, seeds: Sequence[int | None], record_video: bool = False) -> EvaluationOutput:
        """Play one episode per seed; with ``record_video``, the first is recorded and its MP4 returned."""
        if not record_video:
            return EvaluationOutput(self._run(seeds))
        # Recorded where this process runs, which may not be the driver's node: the bytes travel back.
        with tempfile.TemporaryDirectory(prefix="flowrl-video-") as directory:
            videos = Path(directory, "videos")  # new to RecordVideo, which warns about a folder that exists
            episodes = self._run(seeds, video_dir=videos, record=1)
            files = video_files(videos)
            return EvaluationOutput(episodes, files[0].read_bytes() if files else None)

    def _run(self, seeds: Sequence[int | None], **video: Any) -> list[dict[str, Any]]:
        return run_episodes(
            self.policy_map,
            self._env_creator,
            self.config,
            seeds,
            explore=self.explore,
            obs_filter=self.obs_filter,
            **video,
        )

    def ping(self) -> str:
        """Answer a health check."""
        return "pong"


class _Share(NamedTuple):
    """The part of an evaluation round one worker plays."""

    position: int  # the worker's, 0-based
    seeds: list[int | None]
    record_video: bool
    retried: bool = False


def split_seeds(seeds: Sequence[int | None], parts: int) -> list[list[int | None]]:
    """``seeds`` in ``parts`` consecutive runs whose lengths differ by at most one (the first ones longer)."""
    size, extra = divmod(len(seeds), parts)
    runs, start = [], 0
    for part in range(parts):
        end = start + size + (1 if part < extra else 0)
        runs.append(list(seeds[start:end]))
        start = end
    return runs


class EvaluationWorkers:
    """``num_workers`` :class:`EvaluationWorker` actors in their bundles of ``reservation``.

    :meth:`start` sends a round (the learner's weights, then each actor's share of the
    episodes) without waiting; :meth:`collect` gathers it. Every wait is bounded by
    ``config.sample_timeout_s``: an actor that dies, raises or does not answer in time is
    killed, recreated in its bundle and counted in :attr:`num_restarts`; the replacement plays
    a lost share once more (one that timed out is not played again, its time is spent).
    New actors (the first ones and each replacement) are waited for until they have started,
    within ``config.worker_startup_timeout_s``, so that starting never counts as a timeout;
    one that cannot start in that time raises :class:`~flowrl.errors.ResourceUnavailableError`.
    """

    def __init__(
        self,
        *,
        env_creator: EnvCreator,
        policy_specs: Mapping[str, PolicySpec],
        config: TrainerConfig,
        num_workers: int,
        reservation: Reservation,
        explore: bool = False,
    ) -> None:
        self._kwargs = {
            "env_creator": env_creator,
            "policy_specs": dict(policy_specs),
            "config": config,
            "explore": explore,
        }
        self._reservation = reservation
        self._timeout_s = config.sample_timeout_s or CALL_TIMEOUT_S
        self._startup_timeout_s = config.worker_startup_timeout_s
        remote = cast(Any, ray.remote)
        self._remote_cls = remote(num_cpus=config.num_cpus_per_worker, max_restarts=0)(EvaluationWorker)
        self.num_restarts = 0
        self.actors: list[Any] = [self._make(index) for index in range(num_workers)]
        try:
            self._wait_started(range(num_workers))
        except BaseException:
            self.stop()
            raise
        self._weights: Any = None
        self._global_vars: Mapping[str, Any] | None = None
        self._filter_stats: RunningStats | None = None
        self._pending: dict[Any, _Share] = {}

    def _make(self, index: int) -> Any:
        options = self._reservation.options(EVALUATION_WORKER, index)
        return self._remote_cls.options(**options).remote(**self._kwargs, worker_index=index + 1)

    def _wait_started(self, positions: Sequence[int]) -> None:
        """Wait until the actors at ``positions`` answer a ping: their constructors ran (or raised, which
        raises here)."""
        pings = {self.actors[index].ping.remote(): index for index in positions}
        ready, pending = ray.wait(list(pings), num_returns=len(pings), timeout=self._startup_timeout_s)
        if pending:
            raise ResourceUnavailableError(
                f"evaluation workers {sorted(pings[ref] + 1 for ref in pending)} did not start within "
                f"worker_startup_timeout_s={self._startup_timeout_s:g}; "
                f"Ray has {ray.available_resources()} available now"
            )
        ray.get(ready)

    def start(
        self,
        weights: Mapping[str, ModelWeights],
        global_vars: Mapping[str, Any],
        seeds: Sequence[int | None],
        record_video: bool,
        filter_stats: RunningStats | None = None,
    ) -> None:
        """Send a round: ``weights`` (one ``ray.put``) and the run's observation statistics to every actor,
        then its share of ``seeds``; the actor playing the first episode records it when ``record_video``."""
        self._weights, self._global_vars = ray.put(dict(weights)), dict(global_vars)
        self._filter_stats = filter_stats
        self._pending = {}
        for index, share_seeds in enumerate(split_seeds(seeds, len(self.actors))):
            if share_seeds:
                share = _Share(index, share_seeds, record_video and index == 0)
                self._pending[self._submit(share)] = share

    def _submit(self, share: _Share) -> Any:
        actor = self.actors[share.position]
        actor.set_weights.remote(self._weights, self._global_vars)  # an actor runs its calls in order
        actor.set_filter.remote(self._filter_stats)
        return actor.evaluate.remote(share.seeds, share.record_video)

    def collect(self) -> EvaluationOutput:
        """The episodes of the round :meth:`start` sent (those its failed actors lost left out), and its video."""
        pending, self._pending = self._pending, {}
        episodes: list[dict[str, Any]] = []
        video = None
        deadline = time.monotonic() + self._timeout_s
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                for share in pending.values():
                    self._replace(share.position, f"gave no answer within sample_timeout_s={self._timeout_s:g}")
                break
            share = pending.pop(ready[0])
            try:
                output = ray.get(ready[0])
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as e:
                died = isinstance(e, ray.exceptions.RayActorError)
                reason = str(e).strip().splitlines()[-1].rstrip(".")
                self._replace(share.position, f"{'died' if died else 'raised an error'} ({reason})")
                if not share.retried:
                    retry = share._replace(retried=True)
                    pending[self._submit(retry)] = retry
                    deadline = max(deadline, time.monotonic() + self._timeout_s)
                continue
            episodes += output.episodes
            video = video if video is not None else output.video
        return EvaluationOutput(episodes, video)

    def _replace(self, index: int, what: str) -> None:
        logger.warning("evaluation worker %d %s; recreating it", index + 1, what)
        ray.kill(self.actors[index], no_restart=True)
        self.num_restarts += 1
        self.actors[index] = self._make(index)
        try:
            self._wait_started([index])
        except ray.exceptions.RayActorError as e:  # its next call fails too, and replaces it again
            logger.warning("the replacement of evaluation worker %d failed to start: %s", index + 1, e)

    def stop(self) -> None:
        """Kill every actor (idempotent)."""
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors, self._pending = [], {}
