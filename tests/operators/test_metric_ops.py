"""Iteration pacing (OncePerTimeInterval, OncePerTimestepsElapsed) and result building (CollectMetrics)."""

from __future__ import annotations

import math
import types
from typing import Any, Callable

import pytest
from fakes import FakeWorker, FakeWorkerSet, add_steps, from_list

from flowrl.actors import WorkerMetrics
from flowrl.config import TrainerConfig
from flowrl.iterators import LocalIterator
from flowrl.operators import (
    STEPS_SAMPLED_COUNTER,
    STEPS_TRAINED_COUNTER,
    CollectMetrics,
    OncePerTimeInterval,
    OncePerTimestepsElapsed,
    StandardMetricsReporting,
    metric_ops,
)
from flowrl.operators.metric_ops import summarize_episodes

pytestmark = pytest.mark.unit


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now

    def advancing(self, seconds: float) -> Callable[[Any], Any]:
        """A pass-through step that moves the clock on by ``seconds`` per item."""

        def tick(item: Any) -> Any:
            self.now += seconds
            return item

        return tick


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock(1000.0)
    monkeypatch.setattr(metric_ops, "time", types.SimpleNamespace(monotonic=fake.monotonic))
    return fake


# --- pacing ---


def test_once_per_time_interval_passes_at_most_once_per_delay(clock: FakeClock) -> None:
    gate = OncePerTimeInterval(5.0)
    passed = []
    for now in (1000.0, 1002.0, 1004.9, 1005.0, 1009.0, 1010.0, 1010.1):
        clock.now = now
        passed.append(gate(object()))
    # The first interval starts with the first item.
    assert passed == [False, False, False, True, False, True, False]


def test_once_per_time_interval_with_zero_delay_passes_everything(clock: FakeClock) -> None:
    gate = OncePerTimeInterval(0)
    assert all(gate(i) for i in range(5))


def test_once_per_timesteps_elapsed_counts_sampled_steps() -> None:
    flow = from_list(range(10)).for_each(add_steps(sampled=10)).filter(OncePerTimestepsElapsed(25))
    assert list(flow) == [2, 5, 8]  # at 30, 60 and 90 sampled steps


def test_once_per_timesteps_elapsed_by_steps_trained_ignores_sampled_steps() -> None:
    flow = (
        from_list(range(6))
        .for_each(add_steps(sampled=1000, trained=20))
        .filter(OncePerTimestepsElapsed(40, by_steps_trained=True))
    )
    assert list(flow) == [1, 3, 5]  # at 40, 80 and 120 trained steps


def test_once_per_timesteps_elapsed_with_zero_passes_everything() -> None:
    flow = from_list(range(4)).filter(OncePerTimestepsElapsed(0))
    assert list(flow) == [0, 1, 2, 3]


# --- summaries and CollectMetrics ---


def test_summarize_episodes_without_episodes_gives_nan() -> None:
    summary = summarize_episodes([])
    assert set(summary) == {"episode_reward_mean", "episode_reward_min", "episode_reward_max", "episode_len_mean"}
    assert all(math.isnan(v) for v in summary.values())


def test_summarize_episodes_gives_mean_min_max_and_mean_length() -> None:
    summary = summarize_episodes(
        [{"episode_reward": 1.0, "episode_length": 10}, {"episode_reward": 5.0, "episode_length": 30}]
    )
    assert summary == {
        "episode_reward_mean": 3.0,
        "episode_reward_min": 1.0,
        "episode_reward_max": 5.0,
        "episode_len_mean": 20.0,
    }


def test_collect_metrics_smooths_over_the_last_min_history_episodes() -> None:
    remotes = [
        FakeWorker([[(10.0, 10)], [(30.0, 30), (40.0, 40)]]),
        FakeWorker([[(20.0, 20)], [(50.0, 50)]]),
    ]
    local = FakeWorker([[(999.0, 999)], [(999.0, 999)]])  # the driver's copy does not sample
    workers = FakeWorkerSet(local=local, remotes=remotes)

    def train_step(item: Any) -> Any:
        metrics = LocalIterator.get_metrics()
        metrics.counters[STEPS_SAMPLED_COUNTER] += 100
        metrics.counters[STEPS_TRAINED_COUNTER] += 80
        metrics.info["learner"] = {"default_policy": {"loss": float(item)}}
        metrics.timers["learn"].push(0.25)
        metrics.timers["learn"].push_units_processed(80)
        return item

    flow = from_list([1, 2]).for_each(train_step).for_each(CollectMetrics(workers, min_history=3))
    first, second = list(flow)

    assert first["episodes_this_iter"] == 2
    assert (first["episode_reward_mean"], first["episode_reward_min"], first["episode_reward_max"]) == (
        15.0,
        10.0,
        20.0,
    )
    assert second["episodes_this_iter"] == 3 and second["episodes_total"] == 5
    # Only the last 3 episodes (30, 40, 50) count.
    assert (second["episode_reward_mean"], second["episode_reward_min"], second["episode_reward_max"]) == (
        40.0,
        30.0,
        50.0,
    )
    assert second["episode_len_mean"] == 40.0
    assert second["timesteps_total"] == 200 and second["timesteps_trained"] == 160
    assert second["info"]["learner"] == {"default_policy": {"loss": 2.0}}
    assert second["info"][STEPS_SAMPLED_COUNTER] == 200 and second["info"][STEPS_TRAINED_COUNTER] == 160
    assert second["timers"]["learn_time_ms"] == pytest.approx(250.0)
    assert second["timers"]["learn_throughput"] == pytest.approx(320.0)
    assert second["num_worker_restarts"] == 0 and second["num_healthy_workers"] == 2


def test_collect_metrics_counts_episodes_of_the_selected_workers_and_faults_of_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    remotes = [FakeWorker([[(10.0, 10)]]), FakeWorker([[(20.0, 20)]]), FakeWorker([[(30.0, 30)]])]
    monkeypatch.setattr(
        remotes[0], "get_metrics", lambda: WorkerMetrics([{"episode_reward": 10.0, "episode_length": 10}], 2, 1)
    )
    workers = FakeWorkerSet(remotes=remotes)
    result = from_list([0]).for_each(CollectMetrics(workers, selected_workers=[3])).take(1)[0]
    assert result["episodes_this_iter"] == 1 and result["episode_reward_mean"] == 30.0
    assert (result["num_faulty_episodes"], result["num_bad_observations"]) == (2, 1)
    assert result["num_late_fragments"] == 0 and result["num_nonfinite_updates"] == 0


def test_collect_metrics_falls_back_to_every_worker_when_none_selected_is_in_service() -> None:
    workers = FakeWorkerSet(remotes=[FakeWorker([[(10.0, 10)]])])
    result = from_list([0]).for_each(CollectMetrics(workers, selected_workers=[5])).take(1)[0]
    assert result["episodes_this_iter"] == 1


def test_collect_metrics_uses_the_local_worker_when_there_are_no_remote_ones() -> None:
    workers = FakeWorkerSet(local=FakeWorker([[(7.0, 7), (9.0, 9)]]), remotes=[])
    result = from_list([0]).for_each(CollectMetrics(workers)).take(1)[0]
    assert result["episodes_this_iter"] == 2 and result["episode_reward_mean"] == 8.0


def test_collect_metrics_with_no_episodes_reports_nan_and_zero_episodes() -> None:
    workers = FakeWorkerSet(local=FakeWorker([]), remotes=[FakeWorker([])])
    result = from_list([0]).for_each(add_steps(sampled=5)).for_each(CollectMetrics(workers)).take(1)[0]
    assert result["episodes_this_iter"] == 0 and math.isnan(result["episode_reward_mean"])
    assert result["timesteps_total"] == 5


# --- StandardMetricsReporting ---


def reporting_config(**overrides: Any) -> TrainerConfig:
    return TrainerConfig.from_dict({"metrics_smoothing_episodes": 10, **overrides})


def test_standard_metrics_reporting_yields_one_result_per_train_item() -> None:
    workers = FakeWorkerSet(local=FakeWorker([]), remotes=[FakeWorker([[(1.0, 1)], [(3.0, 3)]])])
    train_op = from_list(range(4)).for_each(add_steps(sampled=10))
    results = list(StandardMetricsReporting(train_op, workers, reporting_config()))
    assert len(results) == 4
    assert [r["timesteps_total"] for r in results] == [10, 20, 30, 40]
    assert [r["episodes_this_iter"] for r in results] == [1, 1, 0, 0]
    assert results[-1]["episode_reward_mean"] == 2.0


def test_standard_metrics_reporting_waits_for_timesteps_per_iteration() -> None:
    workers = FakeWorkerSet(local=FakeWorker([]), remotes=[FakeWorker([])])
    train_op = from_list(range(10)).for_each(add_steps(sampled=10))
    results = list(StandardMetricsReporting(train_op, workers, reporting_config(timesteps_per_iteration=25)))
    assert [r["timesteps_total"] for r in results] == [30, 60, 90]


def test_standard_metrics_reporting_waits_for_min_iter_time_between_results(clock: FakeClock) -> None:
    workers = FakeWorkerSet(local=FakeWorker([]), remotes=[FakeWorker([])])
    train_op = from_list(range(12)).for_each(add_steps(sampled=1)).for_each(clock.advancing(2.0))
    results = list(StandardMetricsReporting(train_op, workers, reporting_config(min_iter_time_s=5)))
    steps = [r["timesteps_total"] for r in results]
    # After the first result, one every 3 items (6 s of fake time >= 5 s).
    assert [b - a for a, b in zip(steps, steps[1:])] == [3] * (len(steps) - 1)


def test_the_first_iteration_also_lasts_min_iter_time(clock: FakeClock) -> None:
    workers = FakeWorkerSet(local=FakeWorker([]), remotes=[FakeWorker([])])
    train_op = from_list(range(6)).for_each(add_steps(sampled=1)).for_each(clock.advancing(2.0))
    results = StandardMetricsReporting(train_op, workers, reporting_config(min_iter_time_s=5))
    first = next(results)
    # Items at 1002 (the clock starts), 1004, 1006, 1008: the first result needs 4 items (6 s >= 5 s).
    assert first["timesteps_total"] == 4
