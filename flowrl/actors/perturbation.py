"""Evaluating weight perturbations on rollout workers, for the derivative-free searches (ES, ARS).

Both algorithms estimate an ascent direction from the returns of antithetic parameter
perturbations ``theta + sigma * eps`` and ``theta - sigma * eps``. What runs in the actors:

- :class:`NoiseTable`: one block of Gaussian noise made from a seed, put in Ray's object
  store once; a perturbation is a slice of it, so workers send back only its start index.
- :class:`PerturbationEvaluator`: runs antithetic pairs (and evaluation episodes of the
  unperturbed weights, recorded as the worker's episode statistics) on a rollout worker;
  :class:`EvaluatePerturbations` is the shard transform that runs it in a worker's actor.
- :class:`PerturbationResult`: what a worker sends back for a round.

The policy's network and its NumPy forward pass live in :mod:`flowrl.policy.perturbable`;
the plan operators around the update in :mod:`flowrl.operators.perturbation_ops`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from flowrl.actors.rollout_worker import RolloutWorker, get_global_worker
from flowrl.actors.sampling.recovery import EpisodeStats
from flowrl.data import DEFAULT_POLICY_ID
from flowrl.deferred import DeferredModule, ray
from flowrl.envs.episodes import run_episode
from flowrl.envs.multi_agent import MultiAgentEnv
from flowrl.errors import ConfigError, FlowRLError
from flowrl.policy.filters import RunningStats

if TYPE_CHECKING:
    from flowrl.policy import perturbable
else:  # torch modules: imported when first used
    perturbable = DeferredModule("flowrl.policy.perturbable")

_WEIGHTED_SUM_CHUNK = 256


# Per process: noise tables fetched from the object store, by object id (read-only, zero-copy views).
_FETCHED_NOISE: dict[str, np.ndarray] = {}
#: Longest wait for the noise table from the object store (it may come from another node).
NOISE_FETCH_TIMEOUT_S = 300.0


def _fetch_noise(ref: ray.ObjectRef[np.ndarray]) -> np.ndarray:
    key = ref.hex()
    if key not in _FETCHED_NOISE:
        _FETCHED_NOISE.clear()  # a worker serves one plan's table at a time
        _FETCHED_NOISE[key] = ray.get(ref, timeout=NOISE_FETCH_TIMEOUT_S)
    return _FETCHED_NOISE[key]


class NoiseTable:
    """``size`` float32 standard normal samples drawn from ``seed``; perturbations are slices of it.

    Drawn once in the driver, when first used. Pickling it (as happens when a shard transform
    holding it is sent to a rollout worker) puts the array in Ray's object store on first use
    and sends only the reference; each worker process fetches it once and keeps it (a
    read-only view of the shared object store memory).
    """

    def __init__(self, size: int, seed: int = 0) -> None:
        if size < 1:
            raise FlowRLError(f"NoiseTable(size={size}): needs at least 1 value")
        self.size = int(size)
        self.seed = int(seed)
        self._array: np.ndarray | None = None  # drawn on first use (a plan declared for its graph never draws it)
        self._ref: ray.ObjectRef[np.ndarray] | None = None

    @property
    def array(self) -> np.ndarray:
        """The whole table."""
        if self._array is None:
            if self._ref is None:
                self._array = np.random.default_rng(self.seed).standard_normal(self.size, dtype=np.float32)
            else:
                self._array = _fetch_noise(self._ref)
        return self._array

    def object_ref(self) -> ray.ObjectRef[np.ndarray]:
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
        return PerturbationResult(
            self.noise_indices[:n],
            self.returns[:n],
            self.lengths[:n],
            self.eval_episodes,
            self.eval_steps,
            self.obs_stats,
        )

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


class PerturbationEvaluator:
    """Runs antithetic pairs of perturbations of a rollout worker's current policy in its first env.

    Each pair shares one env seed (common random numbers); after each pair, with
    probability ``eval_prob``, one episode of the unperturbed weights is run and recorded
    in the worker's episode statistics (what ``CollectMetrics`` reports). Noise indices,
    env seeds and evaluation draws come from the worker's ``perturbations`` random stream
    (seeded by the config's seed and the worker index, and checkpointed with the worker), so
    a seeded run is reproducible and resumes exactly.
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
        env = worker.envs[0]
        if getattr(worker, "multi_agent", False) or isinstance(env, MultiAgentEnv):
            raise FlowRLError("ES and ARS evaluate single-agent envs only; this rollout worker's env is multi-agent")
        self.worker = worker
        self.policy = worker.get_policy(DEFAULT_POLICY_ID)
        model = getattr(self.policy, "model", None)
        if not isinstance(model, perturbable.PerturbableModel):
            raise FlowRLError(
                "perturbation rollouts need a policy over a PerturbableModel (ES/ARS policies), "
                f"got {type(model).__name__}"
            )
        self.model = model
        self.env = env
        self.noise = noise
        self.noise_stdev = float(noise_stdev)
        self.eval_prob = float(eval_prob)
        self.collect_obs_stats = collect_obs_stats
        self.actor = perturbable.FlatActor(model, self.env.action_space, worker.config.clip_actions)
        self.rng = worker.rng_stream("perturbations")  # saved with the worker: a resumed run draws the same

    def _seed(self) -> int:
        return int(self.rng.integers(2**31))

    def _act(self, obs: np.ndarray, info: Any) -> Any:
        return self.actor(obs)  # the model's plain argmax or action: ES and ARS read no action masks

    def _record(self, reward: float, length: int) -> None:
        # The worker's sampler owns the episode statistics that get_metrics() hands out.
        self.worker.record_episode(EpisodeStats(reward, length))

    def run_round(self, num_pairs: int) -> PerturbationResult:
        """Evaluate ``num_pairs`` antithetic pairs around the worker's current weights."""
        theta = perturbable.flat_parameters(self.model)
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
                returns[k, side], lengths[k, side] = run_episode(self.env, self._act, seed, observations)
            if self.rng.random() < self.eval_prob:
                self.actor.set_parameters(theta)
                reward, length = run_episode(self.env, self._act, self._seed())
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
            worker,
            self.noise,
            noise_stdev=self.noise_stdev,
            eval_prob=self.eval_prob,
            collect_obs_stats=self.collect_obs_stats,
        )
        while True:
            yield evaluator.run_round(self.pairs_per_round)

    def __call__(self, samples: Iterator[Any]) -> Iterator[PerturbationResult]:
        return self.rounds(get_global_worker())
