"""Execution plans as graphs: operator order per algorithm, actor nodes, text/Mermaid/DOT, per-operator stats.

One PPO Trainer with 2 remote workers is shared by the module; the other algorithms'
plans are built over its WorkerSet with ``get_algorithm(name).execution_plan``.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any, Iterator

import pytest
from fakes import is_dead

from flowrl import Trainer
from flowrl.algorithms import get_algorithm
from flowrl.iterators import LocalIterator
from flowrl.operators import ActorLink, Concurrently, StatefulOperator
from flowrl.plan.graph import Plan

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(180)]

BASE = {
    "num_workers": 2,
    "num_cpus_per_worker": 0.1,
    "rollout_fragment_length": 10,
    "num_envs_per_worker": 1,
    "train_batch_size": 20,
    "seed": 0,
}
CONFIGS: dict[str, dict[str, Any]] = {
    "pg": BASE,
    "a2c": BASE,
    "a2c_microbatch": {**BASE, "microbatch_size": 10},
    "a3c": BASE,
    "ppo": {**BASE, "sgd_minibatch_size": 10, "num_sgd_iter": 2},
}
ROLLOUT_SOURCE = ["batch_across_shards(rollout_workers)", "for_each(concat_samples)", "for_each(count_steps_sampled)"]
REPORTING = ["filter(OncePerTimestepsElapsed)", "filter(OncePerTimeInterval)", "for_each(CollectMetrics)"]
EXPECTED_LABELS = {
    "pg": ROLLOUT_SOURCE + ["combine(ConcatBatches)", "for_each(TrainOneStep)"] + REPORTING,
    "a2c": ROLLOUT_SOURCE + ["combine(ConcatBatches)", "for_each(TrainOneStep)"] + REPORTING,
    "a2c_microbatch": ROLLOUT_SOURCE
    + [
        "combine(ConcatBatches)",
        "for_each(ComputeGradients)",
        "batch(2)",
        "for_each(AverageGradients)",
        "for_each(ApplyGradients)",
    ]
    + REPORTING,
    "a3c": ["gather_async(rollout_workers.for_each())", "for_each(_record_gradient_source)", "for_each(ApplyGradients)"]
    + REPORTING,
    "ppo": ROLLOUT_SOURCE
    + ["combine(ConcatBatches)", "for_each(StandardizeFields)", "for_each(TrainOneStep)", "for_each(UpdateKL)"]
    + REPORTING,
}
EXPECTED_LINKS = {
    "pg": ("for_each(TrainOneStep)", "broadcast weights"),
    "a2c": ("for_each(TrainOneStep)", "broadcast weights"),
    "a2c_microbatch": ("for_each(ApplyGradients)", "send weights to all"),
    "a3c": ("for_each(ApplyGradients)", "send weights to the source worker"),
    "ppo": ("for_each(TrainOneStep)", "broadcast weights"),
}


@pytest.fixture(scope="module")
def trainer(ray_session: None) -> Iterator[Trainer]:
    t = Trainer("ppo", "CartPole-v1", CONFIGS["ppo"])
    yield t
    t.stop()


def build_plan(case: str, trainer: Trainer) -> Plan:
    algorithm = get_algorithm(case.split("_")[0])
    config = algorithm.config_class.from_dict(CONFIGS[case])
    resources = algorithm.make_resources(trainer.workers, config)
    return Plan(algorithm.execution_plan(trainer.workers, config, resources), name=algorithm.name)


def labels(plan: Plan) -> list[str]:
    return [stage.label for stage in plan.graph.operators.values()]


def op_id(plan: Plan, label: str) -> str:
    (stage,) = [s for s in plan.graph.operators.values() if s.label == label]
    return f"op{stage.id}"


def operator_edges(plan: Plan) -> list[tuple[str, str]]:
    return [(src, dst) for src, dst, _ in plan.graph.edges if src.startswith("op") and dst.startswith("op")]


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_each_algorithm_plan_has_its_operators_in_dataflow_order(case: str, trainer: Trainer) -> None:
    plan = build_plan(case, trainer)
    assert labels(plan) == EXPECTED_LABELS[case]
    # A straight pipeline: each operator reads from the one before it.
    ids = [f"op{s.id}" for s in plan.graph.operators.values()]
    assert operator_edges(plan) == list(zip(ids, ids[1:]))
    # The rollout workers feed the source and receive weights and stats requests.
    assert plan.graph.actors == {"RolloutWorker": 2}
    assert plan.graph.actor_label("RolloutWorker") == "RolloutWorker x2"
    edges = plan.graph.edges
    source = next(iter(plan.graph.operators.values()))
    assert ("actor_RolloutWorker", f"op{source.id}", source.kind) in edges
    op_label, link = EXPECTED_LINKS[case]
    assert (op_id(plan, op_label), "actor_RolloutWorker", link) in edges
    assert (op_id(plan, "for_each(CollectMetrics)"), "actor_RolloutWorker", "collect episode stats") in edges


def test_the_trainer_plan_is_the_algorithm_plan(trainer: Trainer) -> None:
    assert trainer.plan.name == "ppo"
    assert labels(trainer.plan) == EXPECTED_LABELS["ppo"]
    assert trainer.plan.graph.actors == {"RolloutWorker": 2}


def test_describe_lists_operators_their_inputs_and_actors(trainer: Trainer) -> None:
    plan = trainer.plan
    text = plan.describe()
    assert text.startswith("plan ppo:")
    stages = list(plan.graph.operators.values())
    assert "[1] batch_across_shards(rollout_workers)  <- RolloutWorker x2" in text  # numbered from 1, in order
    for number, (previous, stage) in enumerate(zip(stages, stages[1:]), start=2):
        assert f"[{number}] {stage.label}  <- {previous.label}" in text
    assert "actors:\n    RolloutWorker x2" in text
    assert "for_each(TrainOneStep) --broadcast weights--> RolloutWorker x2" in text
    assert "for_each(CollectMetrics) --collect episode stats--> RolloutWorker x2" in text
    # Operators appear in dataflow order.
    positions = [text.index(f"] {label}") for label in EXPECTED_LABELS["ppo"]]
    assert positions == sorted(positions)


def test_mermaid_has_every_node_and_edge(trainer: Trainer) -> None:
    plan = trainer.plan
    mermaid = plan.to_mermaid()
    lines = mermaid.splitlines()
    assert lines[0] == "flowchart TD"
    for stage in plan.graph.operators.values():
        assert f'    op{stage.id}["{stage.label}"]' in lines
    assert '    actor_RolloutWorker(["RolloutWorker x2"])' in lines
    for src, dst in operator_edges(plan):
        assert f"    {src} --> {dst}" in lines
    train = op_id(plan, "for_each(TrainOneStep)")
    assert f'    {train} -->|"broadcast weights"| actor_RolloutWorker' in lines
    source = op_id(plan, "batch_across_shards(rollout_workers)")
    assert f'    actor_RolloutWorker -->|"batch_across_shards"| {source}' in lines
    # No edge points at a node that is not drawn.
    defined = set(re.findall(r"^    (\w+)[\[(]", mermaid, re.M))
    endpoints = {name for line in lines if "-->" in line for name in re.findall(r"\b(op\d+|actor_\w+)\b", line)}
    assert endpoints <= defined


def test_dot_has_every_node_and_edge(trainer: Trainer) -> None:
    plan = trainer.plan
    dot = plan.to_dot()
    lines = dot.splitlines()
    assert lines[0] == 'digraph "ppo" {' and lines[-1] == "}"
    for stage in plan.graph.operators.values():
        assert f'    op{stage.id} [shape=box, label="{stage.label}"];' in lines
    assert '    actor_RolloutWorker [shape=ellipse, label="RolloutWorker x2"];' in lines
    for src, dst in operator_edges(plan):
        assert f"    {src} -> {dst};" in lines
    train = op_id(plan, "for_each(TrainOneStep)")
    assert f'    {train} -> actor_RolloutWorker [label="broadcast weights"];' in lines
    assert dot.count(" -> ") == len(plan.graph.edges)


def test_concurrently_plumbing_is_hidden_from_the_graph() -> None:
    def store(item: Any) -> Any:
        return item

    def replay(item: Any) -> Any:
        return item

    def report(item: Any) -> Any:
        return item

    store_op = LocalIterator(lambda timeout: iter(range(3)), name="rollouts").for_each(store)
    replay_op = LocalIterator(lambda timeout: iter(range(3)), name="replay").for_each(replay)
    merged = Concurrently([store_op, replay_op], mode="round_robin", output_indexes=[1], round_robin_weights=[1, "*"])
    plan = Plan(merged.for_each(report), name="mixed")
    assert labels(plan) == [
        "rollouts",
        "for_each(store)",
        "replay",
        "for_each(replay)",
        "union[deterministic]",
        "for_each(report)",
    ]
    ids = {label: op_id(plan, label) for label in labels(plan)}
    # Both branches feed the union directly and the union feeds the next visible operator.
    assert (ids["for_each(store)"], ids["union[deterministic]"]) in operator_edges(plan)
    assert (ids["for_each(replay)"], ids["union[deterministic]"]) in operator_edges(plan)
    assert (ids["union[deterministic]"], ids["for_each(report)"]) in operator_edges(plan)
    for text in (plan.describe(), plan.to_mermaid(), plan.to_dot()):
        for hidden in ("_Tag", "_KeepOutputs", "_untag"):
            assert hidden not in text
    assert list(plan) == [0, 1, 2]


def check_stats(stats: dict[str, dict[str, float]], plan: Plan, iteration_s: float) -> None:
    assert list(stats) == [f"{i}:{s.label}" for i, s in enumerate(plan.graph.operators.values(), start=1)]
    for entry in stats.values():
        assert entry["time_s"] >= 0 and 0 <= entry["share"] <= 1
        assert math.isclose(entry["share"], entry["time_s"] / iteration_s, abs_tol=1e-3)
    assert sum(e["share"] for e in stats.values()) <= 1.001


def test_train_reports_per_operator_stats(trainer: Trainer) -> None:
    result = trainer.train()
    stats = result["plan"]["operators"]
    check_stats(stats, trainer.plan, result["plan"]["iteration_s"])
    by_label = {key.split(":", 1)[1]: value for key, value in stats.items()}
    assert by_label["for_each(TrainOneStep)"]["items"] == 1
    assert by_label["for_each(TrainOneStep)"]["items_per_s"] > 0
    assert by_label["for_each(CollectMetrics)"]["items"] == 1
    # train_batch_size 20 = one round of 2 fragments of 10 steps.
    assert by_label["batch_across_shards(rollout_workers)"]["items"] == 1
    second = trainer.train()["plan"]["operators"]
    by_label = {key.split(":", 1)[1]: value for key, value in second.items()}
    assert by_label["for_each(TrainOneStep)"]["items"] == 1  # this iteration's
    assert by_label["for_each(TrainOneStep)"]["items_total"] == 2  # since the plan started


def test_a3c_plan_runs_and_counts_applied_gradients(trainer: Trainer) -> None:
    plan = build_plan("a3c", trainer)
    started = time.perf_counter()
    result = next(plan)
    elapsed = time.perf_counter() - started
    assert result["timesteps_total"] == 10 and result["timesteps_trained"] == 10
    stats = plan.stats(elapsed)["operators"]
    check_stats(stats, plan, elapsed)
    by_label = {key.split(":", 1)[1]: value for key, value in stats.items()}
    assert by_label["for_each(ApplyGradients)"]["items"] == 1
    assert by_label["gather_async(rollout_workers.for_each())"]["items"] == 1


def test_stats_before_the_first_item_are_zero(trainer: Trainer) -> None:
    plan = build_plan("pg", trainer)
    stats = plan.stats(1.0)
    assert all(e["items"] == 0 and e["time_s"] == 0 and e["items_per_s"] == 0 for e in stats["operators"].values())
    assert stats["latency_s"] == {}


def test_dqn_plan_runs_store_and_replay_side_by_side() -> None:
    from flowrl import Trainer

    config = {
        "num_workers": 0,
        "learning_starts": 64,
        "train_batch_size": 16,
        "timesteps_per_iteration": 100,
        "seed": 0,
    }
    trainer = Trainer("dqn", "CartPole-v1", config)
    try:
        labels = [stage.label for stage in trainer.plan.graph.operators.values()]
        for expected in (
            "for_each(StoreToReplayBuffer)",
            "replay",
            "for_each(TrainOneStep)",
            "for_each(UpdatePriorities)",
            "for_each(UpdateTargetNetwork)",
            "union[deterministic]",
            "for_each(CollectMetrics)",
        ):
            assert any(label.startswith(expected) or label == expected for label in labels), (expected, labels)
        assert not any("_Tag" in label or "_KeepOutputs" in label for label in labels)
        result = trainer.train()
        assert result["timesteps_total"] >= 100 and result["info"]["num_steps_trained"] > 0
        assert "td_error" not in result["info"]["learner"].get("default_policy", {})
    finally:
        trainer.stop()


def test_apex_plan_has_three_concurrent_subflows_and_releases_its_actors() -> None:
    from flowrl import Trainer

    config = {
        "num_workers": 2,
        "num_cpus_per_worker": 0.1,
        "num_envs_per_worker": 1,
        "rollout_fragment_length": 20,
        "learning_starts": 100,
        "train_batch_size": 16,
        "timesteps_per_iteration": 200,
        "seed": 0,
    }
    trainer = Trainer("apex", "CartPole-v1", config)
    try:
        plan = trainer.plan
        labels = [stage.label for stage in plan.graph.operators.values()]
        for expected in (
            "transform(ThrottleSampling)",
            "for_each(StoreToReplayBuffer)",
            "for_each(SendWeightsToSource)",
            "transform(Enqueue)",
            "dequeue",
            "for_each(UpdatePriorities)",
            "for_each(UpdateTargetNetwork)",
            "union[async]",
        ):
            assert expected in labels, (expected, labels)
        assert plan.graph.actors["RolloutWorker"] == 2 and plan.graph.actors["ReplayActor"] == 1
        assert "LearnerThread" in plan.graph.actors
        result = trainer.train()
        assert result["timesteps_total"] >= 200 and result["info"]["num_steps_trained"] > 0
        # The learner's queue and throughput and the shards' sizes reach the result.
        learner_stats, [shard_stats] = result["info"]["learner_thread"], result["info"]["replay_shards"]
        assert learner_stats["num_batches_trained"] > 0 and learner_stats["inqueue_capacity"] == 16
        assert learner_stats["learn_throughput"] > 0 and shard_stats["num_steps_added"] > 0
        epsilons = trainer.workers.foreach_worker(lambda w: w.get_policy().exploration.epsilon(0))
        assert epsilons[0] == 0.0 and epsilons[1] == pytest.approx(0.4) and epsilons[2] == pytest.approx(0.4**8)
        learner, shards = trainer.resources.learner, trainer.resources.replay_actors
    finally:
        trainer.stop()
    assert not trainer.workers.remote_workers()
    assert learner is not None and not learner.is_alive()
    assert is_dead(shards[0])


def test_apex_ddpg_runs_ddpg_on_the_apex_plan() -> None:
    from flowrl import Trainer

    config = {
        "num_workers": 2,
        "num_cpus_per_worker": 0.1,
        "num_envs_per_worker": 1,
        "rollout_fragment_length": 20,
        "learning_starts": 100,
        "train_batch_size": 16,
        "timesteps_per_iteration": 200,
        "seed": 0,
    }
    trainer = Trainer("apex_ddpg", "Pendulum-v1", config)
    try:
        labels = [stage.label for stage in trainer.plan.graph.operators.values()]
        assert "for_each(UpdatePriorities)" in labels and "transform(Enqueue)" in labels
        result = trainer.train()
        assert result["info"]["num_steps_trained"] > 0
        assert type(trainer.workers.local_worker().get_policy().model).__name__ == "ActorCritics"
    finally:
        trainer.stop()


def test_impala_plan_feeds_a_learner_thread_and_counts_what_it_trained() -> None:
    from flowrl import Trainer

    config = {
        "num_workers": 2,
        "num_cpus_per_worker": 0.1,
        "num_envs_per_worker": 2,
        "rollout_fragment_length": 10,
        "train_batch_size": 40,
        "timesteps_per_iteration": 200,
        "seed": 0,
    }
    trainer = Trainer("impala", "CartPole-v1", config)
    try:
        labels = [stage.label for stage in trainer.plan.graph.operators.values()]
        for expected in (
            "for_each(SendWeightsToSource)",
            "combine(ConcatBatches)",
            "transform(Enqueue)",
            "dequeue",
            "for_each(RecordLearnerResults)",
            "union[async]",
        ):
            assert expected in labels, (expected, labels)
        assert "LearnerThread" in trainer.plan.graph.actors
        result = trainer.train()
        assert result["info"]["num_steps_trained"] > 0
        assert set(result["info"]["learner"]["default_policy"]) >= {"policy_loss", "vf_loss", "entropy"}
        for _ in range(20):  # workers get new weights once the learner has updated since their last batch
            if result["info"].get("num_weight_syncs", 0) > 0:
                break
            result = trainer.train()
        assert result["info"]["num_weight_syncs"] > 0
    finally:
        trainer.stop()


# --- the operator protocol ---


class Counter_(StatefulOperator):
    """A stateful pass-through operator keeping how many items it saw."""

    state_key = "counter"

    def __init__(self) -> None:
        self.seen = 0

    def plan_links(self) -> list[ActorLink]:
        return [ActorLink("Somewhere", "count")]

    def get_state(self) -> dict[str, Any]:
        return {"seen": self.seen}

    def set_state(self, state: Any) -> None:
        self.seen = state["seen"]

    def __call__(self, item: Any) -> Any:
        self.seen += 1
        return item


class DuckTyped:
    """Has the protocol's method names but does not declare the protocol: the plan ignores them."""

    plan_hidden = True

    def plan_links(self) -> list[tuple[str, str]]:
        return [("Elsewhere", "nothing")]

    def get_state(self) -> dict[str, Any]:
        raise AssertionError("a checkpoint must not read an undeclared operator")

    def __call__(self, item: Any) -> Any:
        return item


def test_checkpoints_key_stateful_operators_by_their_state_key_not_their_position() -> None:
    def plan_of(*ops: Any) -> Plan:
        it: LocalIterator[Any] = LocalIterator(lambda timeout: iter(range(100)))
        for op in ops:
            it = it.for_each(op)
        return Plan(it)

    first, second = Counter_(), Counter_()
    plan = plan_of(first, DuckTyped(), second)
    [next(plan) for _ in range(3)]
    assert plan.get_state()["operators"] == {"counter": {"seen": 3}, "counter#1": {"seen": 3}}
    # A plan with an operator added in front restores each counter by key, not by position.
    restored_first, restored_second = Counter_(), Counter_()
    other = plan_of(lambda item: item, restored_first, restored_second)
    other.set_state(plan.get_state())
    assert (restored_first.seen, restored_second.seen) == (3, 3)


def test_the_graph_reads_declared_operators_only() -> None:
    plan = Plan(LocalIterator(lambda timeout: iter(range(3))).for_each(DuckTyped()).for_each(Counter_()))
    labels = [stage.label for stage in plan.graph.operators.values()]
    assert "for_each(DuckTyped)" in labels  # plan_hidden on an undeclared callable hides nothing
    assert plan.graph.actors == {"Somewhere": 1} and "Elsewhere" not in plan.to_mermaid()
