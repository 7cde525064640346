"""The rollout worker (the RLlib paper's "policy evaluator"): envs, policies and a sampler."""

from __future__ import annotations

import math
import os
import threading
import time
from typing import Any, Callable, Iterator, Mapping, NamedTuple, TypeVar, cast

import gymnasium as gym
import numpy as np

from flowrl._version import __version__
from flowrl.actors.liveness import Progress, ProgressCounter
from flowrl.actors.rng import process_rng_state, set_process_rng_state
from flowrl.actors.sampling.episode_hooks import EpisodeHooks
from flowrl.actors.sampling.multi_agent import MultiAgentSampler
from flowrl.actors.sampling.output import experience_writer
from flowrl.actors.sampling.recovery import EpisodeStats
from flowrl.actors.sampling.vector import VectorSampler
from flowrl.callbacks import EPISODE_HOOKS, make_callbacks, overrides, run_hook
from flowrl.config import TrainerConfig
from flowrl.data import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch
from flowrl.deferred import ray, torch
from flowrl.envs import is_multi_agent_env
from flowrl.envs.context import EnvContext
from flowrl.envs.envpool_backend import make_pool_envs, pool_env_id
from flowrl.envs.registry import EnvCreator
from flowrl.errors import FlowRLError
from flowrl.iterators import HandOffSpan, ParallelIteratorWorker
from flowrl.policy import Policy, PolicySpec
from flowrl.policy.filters import MeanStdFilter, RunningStats, make_observation_filter
from flowrl.policy.mapping import policy_mapping
from flowrl.policy.policy import ModelWeights
from flowrl.policy.worker_priorities import load_target_weights

R = TypeVar("R")

_global_worker: "RolloutWorker | None" = None


def get_global_worker() -> "RolloutWorker":
    """The rollout worker of this process (for functions that run inside a worker's shard)."""
    if _global_worker is None:
        raise RuntimeError("no RolloutWorker has been created in this process")
    return _global_worker


def as_config(config: TrainerConfig | Mapping[str, Any]) -> TrainerConfig:
    """``config`` frozen, or a dict of keys validated into a frozen :class:`~flowrl.config.TrainerConfig`."""
    if isinstance(config, TrainerConfig):
        return config.frozen()
    return TrainerConfig.from_dict(config).frozen()


#: The Ray concurrency group of a remote worker's control calls (health probes, metrics), served
#: in their own thread so that they never queue behind a long or stuck sample.
CONTROL_GROUP = "control"


def control_call(worker: Any, method: str, *args: Any) -> Any:
    """Call ``method`` of a remote rollout worker in its control thread; returns the object ref.

    For calls that only read (``ping``, ``get_metrics``): they are answered while a sample runs.
    """
    return getattr(worker, method).options(concurrency_group=CONTROL_GROUP).remote(*args)


class WorkerMetrics(NamedTuple):
    """What a worker reports per iteration: episodes finished and faults absorbed since its last report,
    and (with ``profile`` on) where its time went since then: ``wall_s``, of which ``sample_s`` in
    its ``samples`` calls of :meth:`RolloutWorker.sample`, of which ``env_s`` stepping the envs and
    ``inference_s`` in the policies' forward passes, and ``serialize_s`` in Ray's hand-off of the
    ``handoffs`` fragments it returned to a gather (serializing and storing them, after
    ``sample()``: see :class:`~flowrl.iterators.ParallelIteratorWorker`)."""

    episodes: list[dict[str, Any]]
    num_faulty_episodes: int = 0
    num_bad_observations: int = 0
    phases: dict[str, float] | None = None
    #: Mean seconds per :meth:`RolloutWorker.sample` since the last report (the one in progress, if none
    #: ended: a lower bound); None if it did not sample.
    fragment_s: float | None = None


class ProcessInfo(NamedTuple):
    """Where a remote worker runs: its Ray node, process id, and the flowrl and torch versions there."""

    node_id: str
    pid: int
    flowrl_version: str
    torch_version: str


class SampleSpan(NamedTuple):
    """One :meth:`RolloutWorker.sample` call, recorded while a run traces an iteration: when it started on
    the wall clock (``time.time_ns()``, comparable across processes) and how long it took, the seconds
    of it spent stepping the envs and in inference (0 with ``profile`` off), the env steps it returned,
    and the process and native thread that ran it."""

    start_ns: int
    duration_ns: int
    env_s: float
    inference_s: float
    steps: int
    pid: int
    thread_id: int


class TracedWork(NamedTuple):
    """What a worker recorded while traced: its :meth:`RolloutWorker.sample` calls, and Ray's hand-off of each
    fragment it returned to a gather (serialization and storing, after the call), in process ``pid``."""

    samples: list[SampleSpan]
    handoffs: list[HandOffSpan]
    pid: int


class RolloutWorker(ParallelIteratorWorker):
    """Steps ``num_envs_per_worker`` envs with its policies and returns sample batches.

    Gymnasium envs act with the policy ``default_policy``. Multi-agent envs (PettingZoo's
    Parallel API) act with every policy: config ``policy_mapping_fn(agent_id)`` picks each
    agent's (None: the only policy), and samples are :class:`~flowrl.data.MultiAgentBatch`.

    Works as a plain object (the local worker, in the driver) or as a Ray actor (remote
    workers). As a :class:`~flowrl.iterators.ParallelIteratorWorker`, its shard yields
    :meth:`sample` forever. ``env_creator(env_config)`` builds one env (ship a picklable
    creator, see :func:`flowrl.envs.get_env_creator`); ``policy_specs`` maps policy ids
    to :class:`~flowrl.policy.PolicySpec`. ``config`` is the algorithm's config object (a
    dict of :class:`~flowrl.config.TrainerConfig` keys also works); the worker reads its
    sampling keys (``num_envs_per_worker``, ``rollout_fragment_length``, ``batch_mode``,
    ``seed``, ``env_config``, ``clip_actions``, ``compress_observations``, ``policy_mapping_fn``,
    ``restart_failed_sub_environments``, ``on_bad_observation``, ``callbacks``,
    ``custom_metrics_from_info``, ``observation_filter``, ``env_backend``).

    ``callbacks`` is this process's instance of the config's callbacks class (see
    :mod:`flowrl.callbacks`): its episode hooks run in the sampler, ``on_sample_end`` after
    each :meth:`sample`.

    Each env's creator gets an :class:`~flowrl.envs.context.EnvContext`: ``env_config``
    plus ``worker_index``, ``vector_index``, ``num_workers`` and ``recreated_worker``
    (``recreated``: this worker replaces one that failed).
    """

    def __init__(
        self,
        *,
        env_creator: EnvCreator,
        policy_specs: Mapping[str, PolicySpec],
        config: TrainerConfig | Mapping[str, Any],
        worker_index: int = 0,
        num_workers: int = 0,
        recreated: bool = False,
    ) -> None:
        self.config = config = as_config(config)
        self.worker_index = worker_index
        self.env_context = EnvContext(
            config.env_config, worker_index=worker_index, num_workers=num_workers, recreated_worker=recreated
        )
        self._env_creator = env_creator
        # Held by whoever changes or reads the policies while another thread may train them
        # (a LearnerThread learns under it; checkpoints and weight broadcasts read under it).
        self.lock = threading.RLock()
        if worker_index > 0:
            # Remote workers share a few cores with the learner: oversubscribed torch
            # threads slow everything down by an order of magnitude.
            torch.set_num_threads(1)
        worker_seed = None if config.seed is None else config.seed + 10_000 * worker_index
        if worker_seed is not None:
            torch.manual_seed(worker_seed)
            np.random.seed(worker_seed % 2**32)
        self.callbacks = make_callbacks(config.callbacks)
        self.envs = self._make_envs(worker_seed)
        self.multi_agent = is_multi_agent_env(self.envs[0])
        if not self.multi_agent and DEFAULT_POLICY_ID not in policy_specs:
            raise FlowRLError(
                f"a single-agent env acts with the policy {DEFAULT_POLICY_ID!r}, but the policies are "
                f"{sorted(policy_specs)}; several policies need a multi-agent env"
            )
        # What the policy acts on instead of raw observations (None: raw ones; ES and ARS filter in their model).
        self.obs_filter: MeanStdFilter | None = None
        if not type(config).filters_observations_in_model:
            space = getattr(self.envs[0], "observation_space", None)
            self.obs_filter = make_observation_filter(config.observation_filter, space, multi_agent=self.multi_agent)
        self.policy_map: dict[str, Policy[Any]] = {}
        for k, (pid, spec) in enumerate(policy_specs.items()):
            # Distinct seeds per policy: two policies of one class must not start identical.
            policy_seed = None if worker_seed is None else worker_seed + 1000 * k
            overrides = {"seed": policy_seed} if policy_seed != spec.config.seed else None
            self.policy_map[pid] = spec.build(overrides, worker_index=worker_index)
        self.sampler: VectorSampler | MultiAgentSampler
        if self.multi_agent:
            if config.batch_mode != "truncate_episodes":
                raise FlowRLError(
                    f"batch_mode={config.batch_mode!r}: multi-agent envs are sampled with 'truncate_episodes' only"
                )
            self.sampler = MultiAgentSampler(
                self.envs,
                self.policy_map,
                policy_mapping(config.policy_mapping_fn, list(self.policy_map)),
                fragment_length=config.rollout_fragment_length,
                seed=worker_seed,
                episode_id_base=worker_index << 40,
                clip_actions=config.clip_actions,
                **self._sampler_options(),
            )
        else:
            self.sampler = VectorSampler(
                cast(list[gym.Env], self.envs),  # not multi-agent: Gymnasium envs
                self.policy_map[DEFAULT_POLICY_ID],
                fragment_length=config.rollout_fragment_length,
                batch_mode=config.batch_mode,
                seed=worker_seed,
                episode_id_base=worker_index << 40,
                clip_actions=config.clip_actions,
                obs_filter=self.obs_filter,
                **self._sampler_options(),
            )
        self.sampler.timed = config.profile
        self.writer = experience_writer(config, worker_index)  # output: the rows it samples, to Parquet files
        if self.writer is not None:
            self.sampler.output = self.writer.write
        self.progress_counter = ProgressCounter()
        self.sampler.on_step = self.progress_counter.step
        if worker_index > 0:  # a remote worker: its heartbeat tells a GIL held by an env step from a hang
            self.progress_counter.start_heartbeat()
        self.sample_s = 0.0  # seconds in sample() (with profile on)
        self.num_samples = 0  # sample() calls (with profile on)
        self._sample_spans: list[SampleSpan] | None = None  # while a list: each sample() call (see trace_samples)
        self._reported = WorkerMetrics([])
        self._rng_streams: dict[str, np.random.Generator] = {}
        super().__init__(self._sample_forever)
        self.time_handoffs = config.profile
        self._reported_phases = self._phase_totals()
        global _global_worker
        _global_worker = self

    def _make_envs(self, seed: int | None) -> list[Any]:
        """The worker's ``num_envs_per_worker`` envs: one from the creator per slot, or (config
        ``env_backend: envpool``) all in one EnvPool, env ``i`` seeded ``seed + i``, stepped by as
        many C++ threads as the worker has CPUs."""
        config = self.config
        if config.env_backend == "envpool":
            cpus = config.num_cpus_per_worker if self.worker_index > 0 else os.cpu_count() or 1
            threads = min(config.num_envs_per_worker, max(1, math.ceil(cpus)))
            env_id = pool_env_id(self._env_creator)
            return make_pool_envs(env_id, config.num_envs_per_worker, config.env_config, seed=seed, num_threads=threads)
        return [self.make_env(i) for i in range(config.num_envs_per_worker)]

    def make_env(self, vector_index: int) -> Any:
        """A new env for slot ``vector_index`` of this worker (its creator gets the :class:`EnvContext`)."""
        return self._env_creator(self.env_context.copy_with(vector_index=vector_index))

    def _sampler_options(self) -> dict[str, Any]:
        """The sampler's handling of failing envs and bad observations, and its episode hooks, from the config."""
        hooks = None
        if overrides(self.callbacks, EPISODE_HOOKS) or self.config.custom_metrics_from_info:
            hooks = EpisodeHooks(
                self.callbacks,
                self.config.custom_metrics_from_info,
                worker_index=self.worker_index,
                num_envs=len(self.envs),
                multi_agent=self.multi_agent,
            )
        return {
            "env_maker": self.make_env if self.config.restart_failed_sub_environments else None,
            "on_bad_observation": self.config.on_bad_observation,
            "worker_index": self.worker_index,
            "hooks": hooks,
        }

    def _sample_forever(self) -> Iterator[SampleBatch | MultiAgentBatch]:
        while True:
            yield self.sample()

    def sample(self) -> SampleBatch | MultiAgentBatch:
        """``rollout_fragment_length x num_envs_per_worker`` env steps (more in complete_episodes mode).

        A :class:`~flowrl.data.MultiAgentBatch` (one batch per policy) for multi-agent envs.
        """
        started = time.perf_counter()
        spans = self._sample_spans
        if spans is not None:
            started_ns, env_s, inference_s = time.time_ns(), self.sampler.env_s, self.sampler.inference_s
        self.progress_counter.sample_started()
        try:
            batch = self.sampler.sample()
        finally:
            self.progress_counter.sample_ended()
        run_hook(self.callbacks, "on_sample_end", batch, self, where=f"worker {self.worker_index}")
        if self.config.compress_observations:
            batch.compress()
        if self.config.profile:
            self.sample_s += time.perf_counter() - started
            self.num_samples += 1
        if spans is not None:
            spans.append(
                SampleSpan(
                    started_ns,
                    time.time_ns() - started_ns,
                    self.sampler.env_s - env_s,
                    self.sampler.inference_s - inference_s,
                    batch.count,
                    os.getpid(),
                    threading.get_native_id(),
                )
            )
        return batch

    def trace_samples(self, on: bool) -> TracedWork:
        """Start (``on``) or stop recording a :class:`SampleSpan` per :meth:`sample` call and a
        :class:`~flowrl.iterators.shards.HandOffSpan` per fragment handed to Ray; returns what was recorded
        since the last call. Ask a remote worker with :func:`control_call`: it answers mid-sample."""
        recorded = TracedWork(self._sample_spans or [], self.handoff_spans or [], os.getpid())
        self._sample_spans = [] if on else None
        self.handoff_spans = [] if on else None
        return recorded

    def get_policy(self, policy_id: str = DEFAULT_POLICY_ID) -> Policy[Any]:
        """The policy called ``policy_id``."""
        return self.policy_map[policy_id]

    def policy_class(self, policy_id: str = DEFAULT_POLICY_ID) -> type:
        """The class of policy ``policy_id``."""
        return type(self.get_policy(policy_id))

    def get_weights(self, policies: list[str] | None = None) -> dict[str, ModelWeights]:
        """Weights of the given policies (default all), keyed by policy id."""
        return {pid: self.policy_map[pid].get_weights() for pid in (policies or self.policy_map)}

    def set_weights(
        self,
        weights: Mapping[str, ModelWeights],
        global_vars: Mapping[str, Any] | None = None,
        targets: Mapping[str, ModelWeights] | None = None,
    ) -> None:
        """Load weights per policy id (and ``targets``: target networks' weights, for worker-side
        priorities), then pass ``global_vars`` on to every policy."""
        for pid, w in weights.items():
            self.policy_map[pid].set_weights(w)
        if targets:
            load_target_weights(self.policy_map, targets)
        if global_vars is not None:
            self.set_global_vars(global_vars)

    def set_global_vars(self, global_vars: Mapping[str, Any]) -> None:
        """Pass run-wide variables (e.g. the global timestep) to every policy."""
        for policy in self.policy_map.values():
            policy.on_global_var_update(global_vars)

    def learn_on_batch(self, batch: SampleBatch, policy_id: str = DEFAULT_POLICY_ID) -> dict[str, float]:
        """One gradient step of ``policy_id`` on ``batch``; its learner statistics."""
        return self.policy_map[policy_id].learn_on_batch(batch)

    def compute_gradients(
        self, batch: SampleBatch, policy_id: str = DEFAULT_POLICY_ID
    ) -> tuple[list[np.ndarray], dict[str, float]]:
        """Gradients of ``policy_id``'s loss on ``batch``."""
        return self.policy_map[policy_id].compute_gradients(batch)

    def apply_gradients(self, gradients: list[np.ndarray], policy_id: str = DEFAULT_POLICY_ID) -> None:
        """Apply gradients to ``policy_id``."""
        self.policy_map[policy_id].apply_gradients(gradients)

    def record_episode(self, stats: EpisodeStats) -> None:
        """Report an episode run outside the sampler (e.g. ES's evaluation episodes) with the sampled ones."""
        self.sampler.finished.append(stats)

    def pop_filter_delta(self) -> RunningStats | None:
        """The observation statistics this worker gathered since the last call (None: none, or no filter)."""
        return None if self.obs_filter is None else self.obs_filter.pop_delta()

    def sync_filter(self, merged: RunningStats | None) -> None:
        """Filter with ``merged`` observation statistics (the driver's) plus those gathered here since the last pop."""
        if self.obs_filter is not None:
            self.obs_filter.sync(merged)

    def get_metrics(self) -> WorkerMetrics:
        """The episodes finished and the faults absorbed since the last call (each reported once).

        Ask a remote worker with :func:`control_call` to have it answer without waiting for a
        sample in progress.
        """
        episodes = [vars(s) for s in self.sampler.pop_episode_stats()]
        faulty, bad = self.sampler.num_faulty_episodes, self.sampler.num_bad_observations
        last, self._reported = self._reported, WorkerMetrics([], faulty, bad)
        phases = None
        if self.config.profile:
            totals, last_totals = self._phase_totals(), self._reported_phases
            self._reported_phases = totals
            phases = {key: round(totals[key] - last_totals[key], 6) for key in totals}
        return WorkerMetrics(
            episodes,
            faulty - last.num_faulty_episodes,
            bad - last.num_bad_observations,
            phases,
            self.progress_counter.pop_fragment_s(),
        )

    def _phase_totals(self) -> dict[str, float]:
        sampler = self.sampler
        return {
            "wall_s": time.perf_counter(),
            "sample_s": self.sample_s,
            "samples": self.num_samples,
            "env_s": sampler.env_s,
            "inference_s": sampler.inference_s,
            "serialize_s": self.handoff_s,
            "handoffs": self.handoffs,
        }

    def rng_stream(self, name: str) -> np.random.Generator:
        """A named random stream of this worker (e.g. ES's perturbation draws), seeded from the
        config's seed, the worker index and ``name``, and saved in checkpoints with the worker."""
        stream = self._rng_streams.get(name)
        if stream is None:
            seed = self.config.seed
            stream = np.random.default_rng(None if seed is None else [int(seed), self.worker_index, *name.encode()])
            self._rng_streams[name] = stream
        return stream

    def get_state(self, *, weights: bool = True) -> dict[str, Any]:
        """What resuming this worker exactly where it is needs.

        The policies' states keyed by policy id (with ``weights=False`` only what acting
        needs besides the weights, under ``"policy_sampling"``: a remote worker gets its
        weights from the learner), the sampler's envs and episodes in progress, the observation
        filter's statistics and, in a remote worker (which owns its process), the process's RNG states.
        """
        policies = {pid: p.get_state() if weights else p.get_sampling_state() for pid, p in self.policy_map.items()}
        state = {
            "policies" if weights else "policy_sampling": policies,
            "sampler": self.sampler.get_state(),
            "rng_streams": {name: stream.bit_generator.state for name, stream in self._rng_streams.items()},
            "obs_filter": None if self.obs_filter is None else self.obs_filter.get_state(),
        }
        if self.worker_index > 0:
            state["rng"] = process_rng_state()
        return state

    def set_state(self, state: Mapping[str, Any]) -> list[int]:
        """Restore :meth:`get_state`'s output (of this worker or another of as many envs).

        Returns the vector indices of the envs whose episodes could not be restored and
        started anew (see :meth:`~flowrl.actors.sampling.recovery.FaultTolerantSampler.set_state`).
        """
        for pid, policy_state in state.get("policies", {}).items():
            self.policy_map[pid].set_state(policy_state)
        for pid, sampling_state in state.get("policy_sampling", {}).items():
            self.policy_map[pid].set_sampling_state(sampling_state)
        fresh: list[int] = []
        if "sampler" in state:  # absent in checkpoints written before flowrl saved envs
            fresh = self.sampler.set_state(state["sampler"])
            self._reported = WorkerMetrics([], self.sampler.num_faulty_episodes, self.sampler.num_bad_observations)
        for name, stream_state in state.get("rng_streams", {}).items():
            self.rng_stream(name).bit_generator.state = stream_state
        if self.obs_filter is not None and state.get("obs_filter") is not None:
            self.obs_filter.set_state(state["obs_filter"])
        if "rng" in state and self.worker_index > 0:
            set_process_rng_state(state["rng"])
        return fresh

    def apply(self, fn: Callable[..., R], *args: Any) -> R:
        """Call ``fn(self, *args)`` here (inside the actor for a remote worker)."""
        return fn(self, *args)

    def node_id(self) -> str:
        """The Ray node this worker runs on (through :func:`control_call`, like :meth:`ping`)."""
        return ray.get_runtime_context().get_node_id()

    def process_info(self) -> ProcessInfo:
        """Where this worker runs, and the versions it runs (through :func:`control_call`, like :meth:`ping`)."""
        return ProcessInfo(self.node_id(), os.getpid(), __version__, str(torch.__version__))

    def progress(self) -> Progress:
        """Env steps taken and seconds since the last (through :func:`control_call`: answered mid-sample)."""
        return self.progress_counter.read()

    def ping(self) -> str:
        """Answer a health check (through :func:`control_call`: it shows the process is alive, even mid-sample)."""
        return "pong"

    def stop(self) -> None:
        """Finish the experience file being written (``output``) and close every env, even when one's
        ``close`` raises; the first such error is raised after the rest closed."""
        if self.writer is not None:
            self.writer.close()
        first_error: BaseException | None = None
        for env in self.envs:
            try:
                env.close()
            except Exception as e:  # noqa: BLE001 - close the others first, then report it
                first_error = first_error or e
        if first_error is not None:
            raise FlowRLError(
                f"rollout worker {self.worker_index}: an env's close() raised "
                f"{type(first_error).__name__}: {first_error}"
            ) from first_error
