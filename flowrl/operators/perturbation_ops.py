"""What the derivative-free searches (ES, ARS) share: perturbed rollouts and their bookkeeping.

Both algorithms estimate an ascent direction from the returns of antithetic parameter
perturbations ``theta + sigma * eps`` and ``theta - sigma * eps``. Here:

- :class:`NoiseTable`: one block of Gaussian noise made from a seed, put in Ray's object
  store once; a perturbation is a slice of it, so workers send back only its start index.
- The policy's network and its NumPy forward pass live in :mod:`flowrl.policy.perturbable`.
- :class:`PerturbationEvaluator`: runs antithetic pairs (and evaluation episodes of the
  unperturbed weights, recorded as the worker's episode statistics) on a rollout worker.
- :func:`PerturbationRollouts`: the plan source, synchronous rounds of
  :class:`PerturbationResult` from every rollout worker; :class:`CollectPerturbations`,
  :class:`UpdateObservationFilter` and :class:`BroadcastWeights` the steps around an update.
- :func:`centered_ranks`: ES's fitness shaping.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import ray

from flowrl.actors import RolloutWorker, WorkerSet, get_global_worker
from flowrl.actors.sampler import EpisodeStats
from flowrl.data import DEFAULT_POLICY_ID
from flowrl.errors import ConfigError, FlowRLError
from flowrl.iterators import LocalIterator, SharedMetrics, from_actors
from flowrl.operators.metric_ops import record_learner_info
from flowrl.operators.rollout_ops import count_sampled
from flowrl.operators.names import (
    LEARN_ON_BATCH_TIMER,
    NUM_WEIGHT_SYNCS,
    STEPS_SAMPLED_COUNTER,
    STEPS_TRAINED_COUNTER,
    WORKER_UPDATE_TIMER,
)
from flowrl.policy.perturbable import FlatActor, PerturbableModel, RunningStats, ascend, flat_parameters

PERTURBED_EPISODES_COUNTER = "num_perturbed_episodes"
EVAL_EPISODES_COUNTER = "num_eval_episodes"
EVAL_STEPS_COUNTER = "num_eval_steps"
_WEIGHTED_SUM_CHUNK = 256


# --- the noise table ------------------------------------------------------------------------------

# Per process: noise tables fetched from the object store, by object id (read-only, zero-copy views).
_FETCHED_NOISE: dict[str, np.ndarray] = {}


def _fetch_noise(ref: ray.ObjectRef) -> np.ndarray:
    key = ref.hex()
    if key not in _FETCHED_NOISE:
        _FETCHED_NOISE.clear()  # a worker serves one plan's table at a time
        _FETCHED_NOISE[key] = ray.get(ref)
    return _FETCHED_NOISE[key]


class NoiseTable:
    """``size`` float32 standard normal samples drawn from ``seed``; perturbations are slices of it.

    Built once in the driver. Pickling it (as happens when a shard transform holding it is
    sent to a rollout worker) puts the array in Ray's object store on first use and sends
    only the reference; each worker process fetches it once and keeps it (a read-only view
    of the shared object store memory).
    """

    def __init__(self, size: int, seed: int = 0) -> None:
        if size < 1:
            raise FlowRLError(f"NoiseTable(size={size}): needs at least 1 value")
        self.size = int(size)
        self.seed = int(seed)
        self._array: np.ndarray | None = np.random.default_rng(self.seed).standard_normal(self.size, dtype=np.float32)
        self._ref: ray.ObjectRef | None = None

    @property
    def array(self) -> np.ndarray:
        """The whole table."""
        if self._array is None:
            assert self._ref is not None
            self._array = _fetch_noise(self._ref)
        return self._array

    def object_ref(self) -> ray.ObjectRef:
        """The table in Ray's object store (put there on the first call only)."""
        if self._ref is None:
            self._ref = ray.put(self.array)
        return self._ref

    def __getstate__(self) -> dict[str, Any]:
        return {"size": self.size, "seed": self.seed, "ref": self.object_ref()}

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        self.size, self.seed, self._ref = state["size"], state["seed"], state["ref"]
        self._array = None

    def check_dim(self, dim: int) -> None:
        """Raise :class:`ConfigError` unless slices of ``dim`` values fit in the table."""
        if dim > self.size:
            raise ConfigError(f"noise_table_size={self.size} < {dim}, the number of policy parameters to perturb")

    def sample_index(self, rng: np.random.Generator, dim: int) -> int:
        """A uniformly random start of a slice of ``dim`` values."""
        return int(rng.integers(0, self.size - dim + 1))

    def get(self, index: int, dim: int) -> np.ndarray:
        """The perturbation starting at ``index``: ``dim`` values (a read-only view)."""
        return self.array[index : index + dim]

    def weighted_sum(self, weights: np.ndarray, indices: np.ndarray, dim: int) -> np.ndarray:
        """``sum_i weights[i] * get(indices[i], dim)`` in float64."""
        weights = np.asarray(weights, dtype=np.float64)
        indices = np.asarray(indices, dtype=np.int64)
        if weights.shape != indices.shape:
            raise ValueError(f"weights {weights.shape} and indices {indices.shape} differ in shape")
        total = np.zeros(dim, dtype=np.float64)
        for start in range(0, len(indices), _WEIGHTED_SUM_CHUNK):
            rows = np.stack([self.get(int(i), dim) for i in indices[start : start + _WEIGHTED_SUM_CHUNK]])
            total += weights[start : start + _WEIGHTED_SUM_CHUNK] @ rows.astype(np.float64)
        return total


def run_episode(env: gym.Env, actor: Callable[[np.ndarray], Any], seed: int | None, observations: list[np.ndarray] | None = None) -> tuple[float, int]:
    """One episode of ``actor`` from ``env.reset(seed=seed)``: its return and length.

    Appends every observation acted on to ``observations`` when given.
    """
    obs, _ = env.reset(seed=seed)
    total, length = 0.0, 0
    while True:
        if observations is not None:
            observations.append(obs)
        obs, reward, terminated, truncated, _ = env.step(actor(obs))
        total += float(reward)
        length += 1
        if terminated or truncated:
            return total, length


# --- results --------------------------------------------------------------------------------------


@dataclass
class PerturbationResult:
    """What workers send back: for ``n`` antithetic pairs, the noise index and the two returns and lengths.

    ``returns[:, 0]`` / ``lengths[:, 0]`` are for ``theta + sigma * eps``, ``[:, 1]`` for
    ``theta - sigma * eps``. ``eval_episodes`` / ``eval_steps`` count the unperturbed
    evaluation episodes run alongside (their returns went to the workers' episode
    statistics). ``obs_stats`` summarizes the observations of the perturbed episodes when
    an observation filter is on.
    """

    noise_indices: np.ndarray
    returns: np.ndarray
    lengths: np.ndarray
    eval_episodes: int = 0
    eval_steps: int = 0
    obs_stats: RunningStats | None = None

    @property
    def num_pairs(self) -> int:
        """How many antithetic pairs."""
        return len(self.noise_indices)

    def perturbed_steps(self) -> int:
        """Env steps of the perturbed episodes."""
        return int(self.lengths.sum())

    def env_steps(self) -> int:
        """Every env step taken, evaluation episodes included."""
        return self.perturbed_steps() + self.eval_steps

    def take(self, n: int) -> PerturbationResult:
        """The first ``n`` pairs (the counts of evaluation episodes and observations kept whole)."""
        return PerturbationResult(self.noise_indices[:n], self.returns[:n], self.lengths[:n], self.eval_episodes, self.eval_steps, self.obs_stats)

    @staticmethod
    def concat(results: Sequence[PerturbationResult]) -> PerturbationResult:
        """All pairs of ``results`` in order, their counts summed and observation statistics merged."""
        if not results:
            raise ValueError("PerturbationResult.concat needs at least one result")
        stats = [r.obs_stats for r in results if r.obs_stats is not None]
        merged: RunningStats | None = None
        if stats:
            merged = RunningStats(len(stats[0].mean))
            for s in stats:
                merged.merge(s)
        return PerturbationResult(
            np.concatenate([r.noise_indices for r in results]),
            np.concatenate([r.returns for r in results]),
            np.concatenate([r.lengths for r in results]),
            sum(r.eval_episodes for r in results),
            sum(r.eval_steps for r in results),
            merged,
        )


def concat_perturbations(results: list[PerturbationResult]) -> PerturbationResult:
    """One result holding a round's results from every worker."""
    return PerturbationResult.concat(results)


def centered_ranks(x: np.ndarray) -> np.ndarray:
    """The ranks of all entries of ``x``, scaled to [-0.5, 0.5] (same shape; ties share their mean rank)."""
    x = np.asarray(x)
    flat = x.ravel()
    if flat.size < 2:
        return np.zeros(x.shape, dtype=np.float64)
    _, inverse, counts = np.unique(flat, return_inverse=True, return_counts=True)
    first = np.cumsum(counts) - counts
    ranks = (first + (counts - 1) / 2.0)[inverse.ravel()]
    return (ranks / (flat.size - 1) - 0.5).reshape(x.shape)


# --- evaluating perturbations on a rollout worker ---------------------------------------------------


class PerturbationEvaluator:
    """Runs antithetic pairs of perturbations of a rollout worker's current policy in its first env.

    Each pair shares one env seed (common random numbers); after each pair, with
    probability ``eval_prob``, one episode of the unperturbed weights is run and recorded
    in the worker's episode statistics (what ``CollectMetrics`` reports). Noise indices,
    env seeds and evaluation draws come from a generator seeded by the worker's seed and
    index, so a seeded run is reproducible.
    """

    def __init__(
        self,
        worker: RolloutWorker,
        noise: NoiseTable,
        *,
        noise_stdev: float,
        eval_prob: float,
        collect_obs_stats: bool,
    ) -> None:
        if getattr(worker, "multi_agent", False):
            raise FlowRLError("ES and ARS evaluate single-agent envs only; this rollout worker's env is multi-agent")
        self.worker = worker
        self.policy = worker.get_policy(DEFAULT_POLICY_ID)
        model = getattr(self.policy, "model", None)
        if not isinstance(model, PerturbableModel):
            raise FlowRLError(
                f"perturbation rollouts need a policy over a PerturbableModel (ES/ARS policies), got {type(model).__name__}"
            )
        self.model = model
        self.env = worker.envs[0]
        self.noise = noise
        self.noise_stdev = float(noise_stdev)
        self.eval_prob = float(eval_prob)
        self.collect_obs_stats = collect_obs_stats
        self.actor = FlatActor(model, self.env.action_space, bool(worker.config.get("clip_actions", True)))
        seed = worker.config.get("seed")
        self.rng = np.random.default_rng(None if seed is None else [int(seed), worker.worker_index])

    def _seed(self) -> int:
        return int(self.rng.integers(2**31))

    def _record(self, reward: float, length: int) -> None:
        # The worker's sampler owns the episode statistics that get_metrics() hands out.
        self.worker.record_episode(EpisodeStats(reward, length))

    def run_round(self, num_pairs: int) -> PerturbationResult:
        """Evaluate ``num_pairs`` antithetic pairs around the worker's current weights."""
        theta = flat_parameters(self.model)
        dim = len(theta)
        self.noise.check_dim(dim)
        self.actor.set_normalization(self.model.obs_shift.cpu().numpy(), self.model.obs_scale.cpu().numpy())
        indices = np.empty(num_pairs, dtype=np.int64)
        returns = np.empty((num_pairs, 2), dtype=np.float64)
        lengths = np.empty((num_pairs, 2), dtype=np.int64)
        observations: list[np.ndarray] | None = [] if self.collect_obs_stats else None
        eval_episodes = eval_steps = 0
        for k in range(num_pairs):
            indices[k] = self.noise.sample_index(self.rng, dim)
            perturbation = self.noise_stdev * self.noise.get(int(indices[k]), dim)
            seed = self._seed()
            for side, params in enumerate((theta + perturbation, theta - perturbation)):
                self.actor.set_parameters(params)
                returns[k, side], lengths[k, side] = run_episode(self.env, self.actor, seed, observations)
            if self.rng.random() < self.eval_prob:
                self.actor.set_parameters(theta)
                reward, length = run_episode(self.env, self.actor, self._seed())
                self._record(reward, length)
                eval_episodes += 1
                eval_steps += length
        obs_stats = RunningStats.of(np.asarray(observations)) if observations else None
        return PerturbationResult(indices, returns, lengths, eval_episodes, eval_steps, obs_stats)


@dataclass
class EvaluatePerturbations:
    """The shard transform of :func:`PerturbationRollouts`: one :class:`PerturbationResult` per request.

    Runs inside a rollout worker; it ignores the worker's sample stream (nothing is sampled)
    and evaluates ``pairs_per_round`` pairs with the weights the worker holds at that moment.
    """

    noise: NoiseTable
    pairs_per_round: int
    noise_stdev: float
    eval_prob: float
    collect_obs_stats: bool

    def rounds(self, worker: RolloutWorker) -> Iterator[PerturbationResult]:
        """Rounds forever on ``worker``."""
        evaluator = PerturbationEvaluator(
            worker, self.noise, noise_stdev=self.noise_stdev, eval_prob=self.eval_prob, collect_obs_stats=self.collect_obs_stats
        )
        while True:
            yield evaluator.run_round(self.pairs_per_round)

    def __call__(self, samples: Iterator[Any]) -> Iterator[PerturbationResult]:
        return self.rounds(get_global_worker())


def count_perturbation_steps(result: PerturbationResult) -> PerturbationResult:
    """Add a result's env steps (evaluation included) and episodes to the counters (pass-through)."""
    count_sampled(result.env_steps(), result.env_steps())
    counters = LocalIterator.get_metrics().counters
    counters[PERTURBED_EPISODES_COUNTER] += 2 * result.num_pairs
    counters[EVAL_EPISODES_COUNTER] += result.eval_episodes
    counters[EVAL_STEPS_COUNTER] += result.eval_steps
    return result


def PerturbationRollouts(
    workers: WorkerSet,
    noise: NoiseTable,
    *,
    pairs_per_round: int,
    noise_stdev: float,
    eval_prob: float,
    collect_obs_stats: bool = False,
) -> LocalIterator[PerturbationResult]:
    """Synchronous rounds of antithetic perturbations evaluated by the rollout workers.

    Each round, every remote worker evaluates ``ceil(pairs_per_round / num_workers)`` pairs
    with the weights it holds (a barrier per round, so a round never mixes weights) and the
    round's results are concatenated and counted in ``num_steps_sampled``. With no remote
    workers the local worker evaluates all of them in this process.
    """
    if pairs_per_round < 1:
        raise FlowRLError(f"PerturbationRollouts(pairs_per_round={pairs_per_round}): must be >= 1")
    if getattr(workers.local_worker(), "multi_agent", False):
        raise FlowRLError("ES and ARS train one policy on a single-agent env; this env is multi-agent")
    remote = workers.remote_workers()
    per_worker = math.ceil(pairs_per_round / max(1, len(remote)))
    evaluate = EvaluatePerturbations(noise, per_worker, noise_stdev, eval_prob, collect_obs_stats)
    if not remote:
        local = workers.local_worker()
        source = LocalIterator(lambda timeout: evaluate.rounds(local), SharedMetrics(), name="local_worker.evaluate_perturbations()")
        return source.for_each(count_perturbation_steps)
    actors = from_actors(remote, name="rollout_workers", on_shard_failure=workers.on_shard_failure)
    return actors.transform(evaluate).batch_across_shards().for_each(concat_perturbations).for_each(count_perturbation_steps)


class CollectPerturbations:
    """Gather rounds until they hold ``min_episodes`` perturbed episodes and ``min_steps`` of their steps; use with ``combine``.

    Returns ``[]`` while gathering and ``[result]`` (every pair gathered) once there are enough.
    """

    def __init__(self, min_episodes: int, min_steps: int = 0) -> None:
        if min_episodes < 1:
            raise FlowRLError(f"CollectPerturbations(min_episodes={min_episodes}): must be >= 1")
        self.min_episodes = min_episodes
        self.min_steps = min_steps
        self.buffer: list[PerturbationResult] = []

    def __call__(self, result: PerturbationResult) -> list[PerturbationResult]:
        self.buffer.append(result)
        episodes = sum(2 * r.num_pairs for r in self.buffer)
        steps = sum(r.perturbed_steps() for r in self.buffer)
        if episodes < self.min_episodes or steps < self.min_steps:
            return []
        out = PerturbationResult.concat(self.buffer)
        self.buffer = []
        return [out]


class PerturbationUpdate:
    """One optimizer step of the local worker's policy up a direction estimated from perturbation results (pass-through).

    Subclasses (ES's and ARS's updates) give :meth:`estimate`. Counts the perturbed steps
    used in ``num_steps_trained``; the step's size and the returns go to ``info["learner"]``.
    With ``l2_coeff`` the step also decays the weights (see
    :func:`~flowrl.policy.perturbable.ascend`).
    """

    def __init__(self, workers: WorkerSet, noise: NoiseTable, l2_coeff: float = 0.0) -> None:
        self.policy = workers.local_worker().get_policy()
        self.dim = len(flat_parameters(self.policy.model))
        noise.check_dim(self.dim)
        self.noise = noise
        self.l2_coeff = l2_coeff

    def estimate(self, result: PerturbationResult) -> tuple[np.ndarray, PerturbationResult, dict[str, float]]:
        """``(ascent direction, the part of result it used, extra learner stats)``."""
        raise NotImplementedError

    def __call__(self, result: PerturbationResult) -> PerturbationResult:
        metrics = LocalIterator.get_metrics()
        with metrics.timers[LEARN_ON_BATCH_TIMER] as timer:
            theta = flat_parameters(self.policy.model)
            direction, used, stats = self.estimate(result)
            ascend(self.policy, direction, self.l2_coeff)
            step_norm = float(np.linalg.norm(flat_parameters(self.policy.model) - theta))
            timer.push_units_processed(used.perturbed_steps())
        metrics.counters[STEPS_TRAINED_COUNTER] += used.perturbed_steps()
        weights_norm = float(np.linalg.norm(theta))
        record_learner_info(
            {
                DEFAULT_POLICY_ID: {
                    **stats,
                    "step_norm": step_norm,
                    "weights_norm": weights_norm,
                    "update_ratio": step_norm / max(weights_norm, 1e-8),
                    "perturbed_return_mean": float(used.returns.mean()),
                    "perturbed_return_max": float(used.returns.max()),
                    "num_pairs": used.num_pairs,
                }
            }
        )
        return result


class UpdateObservationFilter:
    """Merge the observation statistics the workers sent into the learner policy's model (pass-through).

    The new normalization reaches the workers with the next weight broadcast.
    """

    def __init__(self, workers: WorkerSet) -> None:
        self.workers = workers

    def __call__(self, result: PerturbationResult) -> PerturbationResult:
        if result.obs_stats is not None:
            model = self.workers.local_worker().get_policy().model
            stats = model.observation_stats()
            stats.merge(result.obs_stats)
            model.set_observation_stats(stats)
        return result


class BroadcastWeights:
    """Send the local worker's weights (observation filter included) to every remote worker (pass-through)."""

    def __init__(self, workers: WorkerSet) -> None:
        self.workers = workers

    def plan_links(self) -> list[tuple[str, str]]:
        """What this operator does to actors, for the plan graph."""
        return [("RolloutWorker", "broadcast weights")]

    def __call__(self, item: Any) -> Any:
        metrics = LocalIterator.get_metrics()
        with metrics.timers[WORKER_UPDATE_TIMER]:
            self.workers.sync_weights(global_vars={"timestep": metrics.counters[STEPS_SAMPLED_COUNTER]})
        metrics.counters[NUM_WEIGHT_SYNCS] += 1
        return item
