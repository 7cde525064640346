"""A run's resources reserved as one Ray placement group: the driver's, its rollout workers',
its replay shards' and its aggregators' bundles (on the test session's one-node, 2-CPU Ray)."""

from __future__ import annotations

from typing import Any

import pytest
import ray
from ray.util.placement_group import placement_group_table
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from flowrl import Trainer
from flowrl.actors.placement import (
    AGGREGATOR,
    DRIVER,
    REPLAY_SHARD,
    WORKER,
    BundleRequest,
    Reservation,
    check_resources,
    trial_bundles,
)
from flowrl.errors import ConfigError

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(180)]


def roles(result: dict[str, Any]) -> list[tuple[str, int, dict[str, float]]]:
    return [(b["role"], b["index"], b["resources"]) for b in result["info"]["placement"]["bundles"]]


def test_the_driver_and_workers_are_reserved_together_and_released_on_stop() -> None:
    trainer = Trainer(
        "ppo",
        "CartPole-v1",
        {
            "num_workers": 2,
            "num_cpus_per_worker": 0.25,
            "num_cpus_for_driver": 0.5,
            "train_batch_size": 200,
            "sgd_minibatch_size": 100,
            "num_sgd_iter": 1,
        },
    )
    group = trainer.workers.reservation.placement_group
    try:
        result = trainer.train()
        assert roles(result) == [(DRIVER, 0, {"CPU": 0.5}), (WORKER, 0, {"CPU": 0.25}), (WORKER, 1, {"CPU": 0.25})]
        here = ray.get_runtime_context().get_node_id()
        assert {b["node_id"] for b in result["info"]["placement"]["bundles"]} == {here}
        assert placement_group_table(group)["state"] == "CREATED"
    finally:
        trainer.stop()
    assert placement_group_table(group)["state"] == "REMOVED"


def test_replay_shards_that_ask_for_cpus_run_in_their_bundles() -> None:
    # The reservation holds both of the session's CPUs: the shards can only start inside it.
    trainer = Trainer(
        "apex",
        "CartPole-v1",
        {
            "num_workers": 2,
            "num_cpus_per_worker": 0.5,
            "num_replay_shards": 2,
            "num_cpus_per_replay_shard": 0.5,
            "learning_starts": 100,
            "timesteps_per_iteration": 200,
            "worker_startup_timeout_s": 30,
        },
    )
    try:
        result = trainer.train()
        assert [(role, index) for role, index, _ in roles(result)] == [
            (WORKER, 0),
            (WORKER, 1),
            (REPLAY_SHARD, 0),
            (REPLAY_SHARD, 1),
        ]
        shards = result["info"]["replay_shards"]  # both started (they answer) and were stored to
        assert len(shards) == 2 and sum(shard["num_steps_added"] for shard in shards) > 0
    finally:
        trainer.stop()


def test_aggregators_run_in_their_bundles() -> None:
    trainer = Trainer(
        "impala",
        "CartPole-v1",
        {
            "num_workers": 2,
            "num_cpus_per_worker": 0.5,
            "num_aggregation_workers": 1,
            "num_cpus_per_aggregator": 1,
            "worker_startup_timeout_s": 30,
        },
    )
    try:
        result = trainer.train()
        assert roles(result)[-1] == (AGGREGATOR, 0, {"CPU": 1.0})
        assert result["timesteps_total"] > 0
    finally:
        trainer.stop()


def test_a_driver_bundle_larger_than_the_driver_node_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        Trainer("pg", "CartPole-v1", {"num_workers": 1, "num_cpus_per_worker": 0.5, "num_cpus_for_driver": 4})
    assert (
        "num_cpus_for_driver=4 + num_workers=1 x num_cpus_per_worker=0.5 needs 4.5 CPU, but the Ray cluster has 2"
        in str(info.value)
    )
    assert "num_cpus_for_driver=4 on the driver's node needs 4 CPU, but that node has 2" in str(info.value)


def test_placement_strategies_the_cluster_cannot_satisfy_are_config_errors() -> None:
    workers = BundleRequest(WORKER, 2, {"CPU": 0.5}, {"CPU": "num_cpus_per_worker"}, "num_workers")
    with pytest.raises(ConfigError, match=r"STRICT_SPREAD' puts each of 2 bundles .* but the Ray cluster has 1 nodes"):
        check_resources([workers], "STRICT_SPREAD")
    big = BundleRequest(AGGREGATOR, 3, {"CPU": 0.5}, {"CPU": "num_cpus_per_aggregator"}, "num_aggregation_workers")
    with pytest.raises(ConfigError) as info:
        check_resources([workers, big], "STRICT_PACK")
    assert (
        "num_workers=2 x num_cpus_per_worker=0.5 + num_aggregation_workers=3 x num_cpus_per_aggregator=0.5 "
        "needs 2.5 CPU" in str(info.value)
    )
    assert "STRICT_PACK' puts every bundle on one node, but no node has 2.5 CPU" in str(info.value)
    check_resources([workers], "STRICT_PACK")  # 1 CPU fits the one node


def test_a_reservation_of_nothing_schedules_actors_as_they_ask() -> None:
    empty = Reservation([BundleRequest(WORKER, 2, {"CPU": 0}, {"CPU": "num_cpus_per_worker"})], "PACK", 5)
    assert not empty.reserved(WORKER) and empty.options(WORKER, 0) == {} and empty.layout() == []
    empty.release()


@ray.remote(num_cpus=0)
class InATrial:
    """Stands for a Tune trainable: runs in bundle 0 of its trial's placement group."""

    def reserve(self) -> tuple[bool, int | None, list[str]]:
        workers = BundleRequest(WORKER, 2, {"CPU": 0.25}, {"CPU": "num_cpus_per_worker"}, "num_workers")
        reservation = Reservation([BundleRequest(DRIVER, 1, {"CPU": 0}, {}), workers], "PACK", 5)
        group = reservation.placement_group
        adopted = group is not None and group.id == ray.util.get_current_placement_group().id
        strategy = reservation.scheduling(WORKER, 1)
        reservation.release()
        return (
            adopted,
            strategy.placement_group_bundle_index if strategy else None,
            [b["role"] for b in reservation.layout()],
        )


def test_inside_a_trials_placement_group_a_reservation_adopts_it() -> None:
    group = ray.util.placement_group(trial_bundles([BundleRequest(WORKER, 2, {"CPU": 0.25}, {})], {"CPU": 0.25}))
    try:
        ray.get(group.ready(), timeout=30)
        strategy = PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=0, placement_group_capture_child_tasks=True
        )
        trial = InATrial.options(scheduling_strategy=strategy).remote()
        adopted, index, layout = ray.get(trial.reserve.remote(), timeout=30)
        assert (adopted, index) == (True, 2)  # worker 1 in bundle 2: bundle 0 is the trainable's
        assert layout == []  # released: no longer the reservation's
        assert placement_group_table(group)["state"] == "CREATED"  # but the trial still holds it
    finally:
        ray.util.remove_placement_group(group)
