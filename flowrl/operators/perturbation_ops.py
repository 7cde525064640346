"""Plan operators of the derivative-free searches (ES, ARS): perturbation rounds and the update around them.

The actors' side (the noise table, evaluating antithetic pairs on a rollout worker, the
results they send back) lives in :mod:`flowrl.actors.perturbation`. Here:
:func:`PerturbationRollouts`, the plan source of synchronous rounds from every rollout
worker; :class:`CollectPerturbations`, :class:`PerturbationUpdate` (ES's and ARS's steps
derive from it), :class:`UpdateObservationFilter` and :class:`BroadcastWeights`, the steps
around an update; :func:`PerturbationSearch`, the whole training flow both plans share;
:func:`centered_ranks`, ES's fitness shaping.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol, TypeVar

import numpy as np

from flowrl.actors import WorkerSet
from flowrl.actors.perturbation import EvaluatePerturbations, NoiseTable, PerturbationResult
from flowrl.data import DEFAULT_POLICY_ID
from flowrl.deferred import DeferredModule
from flowrl.errors import FlowRLError
from flowrl.iterators import LocalIterator, SharedMetrics
from flowrl.operators.metric_ops import record_learner_info
from flowrl.operators.names import (
    LEARN_ON_BATCH_TIMER,
    STEPS_TRAINED_COUNTER,
)
from flowrl.operators.protocol import ActorLink, Operator
from flowrl.operators.rollout_ops import count_sampled, rollout_actors
from flowrl.operators.weight_sync import broadcast_weights, timestep_to_learner
from flowrl.policy import TorchPolicy
from flowrl.policy.perturbation_spec import num_perturbed_parameters

if TYPE_CHECKING:
    from flowrl.policy import perturbable
else:  # torch modules: imported when first used
    perturbable = DeferredModule("flowrl.policy.perturbable")

PERTURBED_EPISODES_COUNTER = "num_perturbed_episodes"
EVAL_EPISODES_COUNTER = "num_eval_episodes"
EVAL_STEPS_COUNTER = "num_eval_steps"


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


def perturbable_policy(workers: WorkerSet) -> TorchPolicy[Any]:
    """The local worker's policy, which perturbation searches step: a TorchPolicy over a PerturbableModel."""
    policy = workers.local_worker().get_policy()
    if not isinstance(policy, TorchPolicy) or not isinstance(policy.model, perturbable.PerturbableModel):
        raise FlowRLError(
            "perturbation searches step a TorchPolicy over a PerturbableModel (ES/ARS policies), "
            f"got {type(policy).__name__}"
        )
    return policy


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
        source: LocalIterator[PerturbationResult] = LocalIterator(
            lambda timeout: evaluate.rounds(local), SharedMetrics(), name="local_worker.evaluate_perturbations()"
        )
        return source.for_each(count_perturbation_steps)
    return (
        rollout_actors(workers)
        .transform(evaluate)
        .batch_across_shards()
        .for_each(PerturbationResult.concat)
        .for_each(count_perturbation_steps)
    )


class CollectPerturbations:
    """Gather rounds until they hold ``min_episodes`` perturbed episodes and ``min_steps`` of their
    steps; use with ``combine``.

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
    """One optimizer step of the local worker's policy up a direction estimated from perturbation
    results (pass-through).

    Subclasses (ES's and ARS's updates) give :meth:`estimate`. Counts the perturbed steps
    used in ``num_steps_trained``; the step's size and the returns go to ``info["learner"]``.
    With ``l2_coeff`` the step also decays the weights (see
    :func:`~flowrl.policy.perturbable.ascend`).
    """

    def __init__(self, workers: WorkerSet, noise: NoiseTable, l2_coeff: float = 0.0) -> None:
        # Checked from the policy's spec when the plan is built; the policy itself is read on the first update.
        policy_class = workers.local_worker().policy_class()
        if not issubclass(policy_class, TorchPolicy):
            raise FlowRLError(
                "perturbation searches step a TorchPolicy over a PerturbableModel (ES/ARS policies), "
                f"got {policy_class.__name__}"
            )
        self.dim = num_perturbed_parameters(workers.policy_specs[DEFAULT_POLICY_ID])
        noise.check_dim(self.dim)
        self.workers = workers
        self.noise = noise
        self.l2_coeff = l2_coeff

    @functools.cached_property
    def policy(self) -> TorchPolicy[Any]:
        """The local worker's policy, which the updates step."""
        policy = perturbable_policy(self.workers)
        assert len(perturbable.flat_parameters(policy.model)) == self.dim, (
            "num_perturbed_parameters() disagrees with the model"
        )
        return policy

    def estimate(self, result: PerturbationResult) -> tuple[np.ndarray, PerturbationResult, dict[str, float]]:
        """``(ascent direction, the part of result it used, extra learner stats)``."""
        raise NotImplementedError

    def __call__(self, result: PerturbationResult) -> PerturbationResult:
        metrics = LocalIterator.get_metrics()
        timestep_to_learner(self.workers)  # an lr_schedule scales the step size
        with metrics.timers[LEARN_ON_BATCH_TIMER] as timer:
            theta = perturbable.flat_parameters(self.policy.model)
            direction, used, stats = self.estimate(result)
            perturbable.ascend(self.policy, direction, self.l2_coeff)
            step_norm = float(np.linalg.norm(perturbable.flat_parameters(self.policy.model) - theta))
            timer.push_units_processed(used.perturbed_steps())
        metrics.counters[STEPS_TRAINED_COUNTER] += used.perturbed_steps()
        weights_norm = float(np.linalg.norm(theta))
        record_learner_info(
            {
                DEFAULT_POLICY_ID: {
                    **stats,
                    "step_norm": step_norm,
                    "cur_lr": self.policy.learning_rates.current,
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
            model = perturbable_policy(self.workers).model
            assert isinstance(model, perturbable.PerturbableModel)
            stats = model.observation_stats()
            stats.merge(result.obs_stats)
            model.set_observation_stats(stats)
        return result


class BroadcastWeights(Operator):
    """Send the local worker's weights (observation filter included) to every remote worker (pass-through)."""

    def __init__(self, workers: WorkerSet) -> None:
        self.workers = workers

    def plan_links(self) -> list[ActorLink]:
        """Broadcasts to the rollout workers."""
        return [ActorLink("RolloutWorker", "broadcast weights")]

    def __call__(self, item: Any) -> Any:
        broadcast_weights(self.workers)
        return item


class PerturbationSearchConfig(Protocol):
    """The keys :func:`PerturbationSearch` reads (ES's and ARS's shared config)."""

    noise_table_size: int
    noise_stdev: float
    eval_prob: float
    observation_filter: Literal["NoFilter", "MeanStdFilter"]
    seed: int | None


C = TypeVar("C", bound=PerturbationSearchConfig)


class SearchRounds(NamedTuple):
    """How a perturbation search samples: ``pairs_per_round`` antithetic pairs asked of the
    workers per round, and an update after ``min_episodes`` perturbed episodes and ``min_steps``
    of their steps."""

    pairs_per_round: int
    min_episodes: int
    min_steps: int = 0


def PerturbationSearch(
    workers: WorkerSet,
    config: C,
    update: Callable[[WorkerSet, NoiseTable, C], PerturbationUpdate],
    rounds: SearchRounds,
) -> LocalIterator[PerturbationResult]:
    """The training flow of a perturbation search: rounds -> CollectPerturbations -> the update
    -> observation filter -> BroadcastWeights.

    A noise table is made from ``config.seed``; ``update(workers, noise, config)`` builds
    the step (ES's or ARS's). Each round asks the workers for ``rounds.pairs_per_round``
    antithetic pairs; an update waits for ``rounds.min_episodes`` perturbed episodes and
    ``rounds.min_steps`` of their steps. With ``observation_filter="MeanStdFilter"`` the workers' observation
    statistics are merged into the policy before the weights go out.
    """
    noise = NoiseTable(config.noise_table_size, seed=config.seed or 0)
    filtered = config.observation_filter == "MeanStdFilter"
    sampled = PerturbationRollouts(
        workers,
        noise,
        pairs_per_round=rounds.pairs_per_round,
        noise_stdev=config.noise_stdev,
        eval_prob=config.eval_prob,
        collect_obs_stats=filtered,
    )
    train_op = sampled.combine(CollectPerturbations(rounds.min_episodes, rounds.min_steps)).for_each(
        update(workers, noise, config)
    )
    if filtered:
        train_op = train_op.for_each(UpdateObservationFilter(workers))
    return train_op.for_each(BroadcastWeights(workers))
