"""Operators that turn a training flow into results: iteration pacing and metrics collection."""

from __future__ import annotations

import collections
import time
from typing import Any, Mapping, Sequence

import numpy as np

from flowrl.actors import WorkerMetrics
from flowrl.actors.protocols import WorkerSetLike
from flowrl.iterators import LATE_ITEMS_COUNTER, LocalIterator
from flowrl.operators.names import LEARNER_INFO, STEPS_SAMPLED_COUNTER, STEPS_TRAINED_COUNTER
from flowrl.operators.protocol import ActorLink, StatefulOperator


class OncePerTimeInterval:
    """A filter that passes an item when at least ``delay_s`` seconds passed since the last one it passed."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.last_passed: float | None = None

    def __call__(self, item: Any) -> bool:
        if self.delay_s <= 0:
            return True
        now = time.monotonic()
        if self.last_passed is None:
            self.last_passed = now  # the first interval starts with the first item
        if now - self.last_passed >= self.delay_s:
            self.last_passed = now
            return True
        return False


class OncePerTimestepsElapsed(StatefulOperator):
    """A filter that passes an item when ``delay_steps`` env steps were sampled (or trained) since the last.

    The count at the last item passed is checkpointed: a restored plan ends its next
    iteration where the uninterrupted one would have.
    """

    state_key = "once_per_timesteps_elapsed"

    def __init__(self, delay_steps: int, by_steps_trained: bool = False) -> None:
        self.delay_steps = delay_steps
        self.counter = STEPS_TRAINED_COUNTER if by_steps_trained else STEPS_SAMPLED_COUNTER
        self.last_passed = 0

    def __call__(self, item: Any) -> bool:
        if self.delay_steps <= 0:
            return True
        now = LocalIterator.get_metrics().counters[self.counter]
        if now - self.last_passed >= self.delay_steps:
            self.last_passed = now
            return True
        return False

    def get_state(self) -> dict[str, Any]:
        return {"last_passed": self.last_passed}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.last_passed = int(state["last_passed"])


def record_learner_info(info: Mapping[str, Any]) -> None:
    """Keep each policy's latest learner stats in the metrics context, beside those of policies
    that other sub-flows of the plan train (what ``info["learner"]`` of a result shows)."""
    metrics = LocalIterator.get_metrics()
    metrics.info[LEARNER_INFO] = {**metrics.info.get(LEARNER_INFO, {}), **info}


def summarize_episodes(episodes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Reward and length statistics of finished episodes (NaN when there are none).

    Multi-agent episodes add ``policy_reward_mean/min/max``: per policy id, statistics of
    the returns of the agents that acted with it.
    """
    rewards = np.array([e["episode_reward"] for e in episodes], dtype=np.float64)
    lengths = np.array([e["episode_length"] for e in episodes], dtype=np.float64)
    if not len(rewards):
        nan = float("nan")
        return {
            "episode_reward_mean": nan,
            "episode_reward_min": nan,
            "episode_reward_max": nan,
            "episode_len_mean": nan,
        }
    summary: dict[str, Any] = {
        "episode_reward_mean": float(rewards.mean()),
        "episode_reward_min": float(rewards.min()),
        "episode_reward_max": float(rewards.max()),
        "episode_len_mean": float(lengths.mean()),
    }
    per_policy: dict[str, list[float]] = collections.defaultdict(list)
    for episode in episodes:
        for policy_id, returns in episode.get("policy_rewards", {}).items():
            per_policy[policy_id].extend(returns)
    if per_policy:
        summary["policy_reward_mean"] = {pid: float(np.mean(r)) for pid, r in per_policy.items()}
        summary["policy_reward_min"] = {pid: float(np.min(r)) for pid, r in per_policy.items()}
        summary["policy_reward_max"] = {pid: float(np.max(r)) for pid, r in per_policy.items()}
    return summary


def summarize_custom_metrics(episodes: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """``<name>_mean``, ``<name>_min`` and ``<name>_max`` of each custom metric over the episodes that recorded it.

    A result holds them under ``"custom_metrics"``, which flattens to ``custom_metrics/<name>_mean``.
    """
    values: dict[str, list[float]] = collections.defaultdict(list)
    for episode in episodes:
        for name, value in episode.get("custom_metrics", {}).items():
            values[name].append(value)
    summary = {}
    for name, series in values.items():
        summary[f"{name}_mean"] = float(np.mean(series))
        summary[f"{name}_min"] = float(np.min(series))
        summary[f"{name}_max"] = float(np.max(series))
    return summary


class CollectMetrics(StatefulOperator):
    """Build one result dict: episode statistics from the workers, the flow's counters and the fault counters.

    Episode statistics, and the custom metrics of callbacks (``result["custom_metrics"]``, see
    :func:`summarize_custom_metrics`), are smoothed over the last ``min_history`` finished
    episodes (``metrics_smoothing_episodes``). ``selected_workers`` lists the worker indices whose
    episodes count (e.g. Ape-X's lowest-epsilon ones; looked up among the live workers each
    time, so replacements count); by default all workers, the local one included only when
    there are no remote workers. Faults absorbed by any worker are counted: the result's
    top-level ``num_healthy_workers``, ``num_worker_restarts``, ``num_workers_missing``, ``num_slow_workers``,
    ``num_faulty_episodes``, ``num_bad_observations``, ``num_nonfinite_updates`` and ``num_late_fragments``.
    """

    state_key = "collect_metrics"

    def __init__(
        self, workers: WorkerSetLike, min_history: int = 100, selected_workers: Sequence[int] | None = None
    ) -> None:
        self.workers = workers
        self.history: collections.deque[dict[str, Any]] = collections.deque(maxlen=min_history)
        self.selected_workers = set(selected_workers) if selected_workers is not None else None
        self.episodes_total = 0
        self.faults = {"num_faulty_episodes": 0, "num_bad_observations": 0}
        self.iteration_started = time.monotonic()

    def plan_links(self) -> list[ActorLink]:
        """Reads the rollout workers' finished episodes."""
        return [ActorLink("RolloutWorker", "collect episode stats")]

    def get_state(self) -> dict[str, Any]:
        """The smoothing window and the episode and fault counts, for checkpoints."""
        return {"history": list(self.history), "episodes_total": self.episodes_total, **self.faults}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`get_state`'s output."""
        self.history.clear()
        self.history.extend(state["history"])
        self.episodes_total = int(state["episodes_total"])
        for key in self.faults:
            self.faults[key] = int(state.get(key, 0))

    def _counted_episodes(self, reports: list[tuple[int, WorkerMetrics]]) -> list[dict[str, Any]]:
        selected = self.selected_workers
        if selected is not None and not selected & {index for index, _ in reports}:
            selected = None  # none of the chosen workers is in service: report what the others saw
        return [e for index, report in reports if selected is None or index in selected for e in report.episodes]

    def __call__(self, item: Any) -> dict[str, Any]:
        metrics = LocalIterator.get_metrics()
        reports = self.workers.collect_metrics()
        episodes = self._counted_episodes(reports)
        for _, report in reports:
            self.faults["num_faulty_episodes"] += report.num_faulty_episodes
            self.faults["num_bad_observations"] += report.num_bad_observations
        self.history.extend(episodes)
        self.episodes_total += len(episodes)
        now = time.monotonic()
        policies = self.workers.local_worker().policy_map.values()
        result: dict[str, Any] = {
            **summarize_episodes(list(self.history)),
            "custom_metrics": summarize_custom_metrics(self.history),
            "episodes_this_iter": len(episodes),
            "episodes_total": self.episodes_total,
            "timesteps_total": metrics.counters[STEPS_SAMPLED_COUNTER],
            "timesteps_trained": metrics.counters[STEPS_TRAINED_COUNTER],
            "time_this_iter_s": now - self.iteration_started,
            "info": {LEARNER_INFO: metrics.info.get(LEARNER_INFO, {}), **dict(metrics.counters)},
            "timers": {f"{name}_time_ms": round(1000 * t.mean, 3) for name, t in metrics.timers.items()},
            "num_healthy_workers": self.workers.num_healthy_workers(),
            "num_worker_restarts": self.workers.num_worker_restarts,
            "num_workers_missing": self.workers.num_workers_missing,
            "num_slow_workers": self.workers.num_slow_workers,
            **self.faults,
            "num_nonfinite_updates": sum(policy.num_nonfinite_updates for policy in policies),
            "num_late_fragments": metrics.counters[LATE_ITEMS_COUNTER],
        }
        for name, timer in metrics.timers.items():
            if timer.units:
                result["timers"][f"{name}_throughput"] = round(timer.mean_throughput, 3)
        phases = worker_phases(reports, in_driver=not self.workers.remote_workers())
        if phases:
            result["plan"] = {"actors": {"RolloutWorker": phases}}
        self.iteration_started = now
        return result


def worker_phases(reports: Sequence[tuple[int, WorkerMetrics]], *, in_driver: bool) -> dict[str, Any]:
    """The rollout workers' time since their last reports, summed: stepping envs, inference, the rest of
    sampling, Ray's serialization of the fragments (or, for A3C, gradients) they returned
    (``serialize_s``, over ``fragments_serialized``) and idle time; and each one's busy share and
    seconds per fragment (for the plan's X-ray: a straggler's are far above its siblings'). Empty
    when no worker measured its time (``profile`` off)."""
    timed = [(index, report.phases) for index, report in reports if report.phases]
    if not timed:
        return {}
    keys = ("wall_s", "sample_s", "env_s", "inference_s", "serialize_s", "handoffs")
    total = {key: sum(phases[key] for _, phases in timed) for key in keys}
    wall, sample, serialize = total["wall_s"], total["sample_s"], total["serialize_s"]
    return {
        "count": len(timed),
        "in_driver": in_driver,
        "env_s": round(total["env_s"], 6),
        "inference_s": round(total["inference_s"], 6),
        "other_s": round(max(0.0, sample - total["env_s"] - total["inference_s"]), 6),
        "serialize_s": round(serialize, 6),
        "fragments_serialized": int(total["handoffs"]),
        "idle_s": round(max(0.0, wall - sample - serialize), 6),
        "busy_share": round(min(1.0, (sample + serialize) / wall), 4) if wall > 0 else 0.0,
        "per_worker": {
            str(index): {
                "busy_share": round(min(1.0, (phases["sample_s"] + phases["serialize_s"]) / phases["wall_s"]), 4)
                if phases["wall_s"] > 0
                else 0.0,
                "fragments": int(phases["samples"]),
                "sample_s_per_fragment": round(phases["sample_s"] / phases["samples"], 6)
                if phases["samples"]
                else None,
            }
            for index, phases in timed
        },
    }


def StandardMetricsReporting(
    train_op: LocalIterator[Any],
    workers: WorkerSetLike,
    config: Any,
    selected_workers: Sequence[int] | None = None,
) -> LocalIterator[dict[str, Any]]:
    """One result per training iteration, from a flow of training outputs.

    An iteration ends after at least ``config.timesteps_per_iteration`` sampled steps and
    ``config.min_iter_time_s`` seconds (0: every item of ``train_op``).
    """
    return (
        train_op.filter(OncePerTimestepsElapsed(config.timesteps_per_iteration))
        .filter(OncePerTimeInterval(config.min_iter_time_s))
        .for_each(CollectMetrics(workers, config.metrics_smoothing_episodes, selected_workers))
    )
