"""Training operators without a cluster: minibatch SGD, TrainOneStep, gradients, target-network updates."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar, cast

import numpy as np
import pytest
from fakes import FakePolicy, FakeWorkerSet, add_steps, from_list, id_batch

from flowrl.actors import Learned, LearnerInfo, PlanResources
from flowrl.actors.learner_group import LEARNER_ACTOR
from flowrl.data import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch
from flowrl.errors import FlowRLError
from flowrl.iterators import LocalIterator
from flowrl.operators import (
    LAST_TARGET_UPDATE_TS,
    LEARNER_INFO,
    NUM_LEARNER_UPDATES,
    NUM_TARGET_UPDATES,
    STEPS_SAMPLED_COUNTER,
    STEPS_TRAINED_COUNTER,
    ActorLink,
    ApplyGradients,
    AverageGradients,
    ComputedGradients,
    ComputeGradients,
    Trained,
    TrainOneStep,
    UpdateTargetNetwork,
)
from flowrl.policy import LearnOutput
from flowrl.policy.sgd import minibatch_sgd

pytestmark = pytest.mark.unit


class FakeLearnerGroup:
    """What the operators use of a learner group: learn (recording the settings) and move targets."""

    size = 2
    update_limit_s = 60.0

    def __init__(self) -> None:
        self.learned: list[dict[str, Any]] = []
        self.target_updates: list[tuple[list[str], float]] = []

    def learn(self, batch: SampleBatch, **settings: Any) -> Learned:
        self.learned.append(settings)
        return Learned(None, {DEFAULT_POLICY_ID: {"loss": 0.5}}, batch.count)

    def update_target(self, policies: list[str], tau: float) -> None:
        self.target_updates.append((policies, tau))


class RecordingLock:
    """A lock that knows whether it is held."""

    def __init__(self) -> None:
        self.held = False

    def __enter__(self) -> None:
        self.held = True

    def __exit__(self, *exc: object) -> None:
        self.held = False


class FakeLearnerThread:
    """A started learner thread: its lock is all UpdateTargetNetwork takes of it."""

    ident = 1

    def __init__(self) -> None:
        self.lock = RecordingLock()
        self.learners = None

    def stop(self) -> None:
        pass


class TargetConfig:
    """A config UpdateTargetNetwork reads (APPO's shape: soft updates counted in learner updates)."""

    target_update_counter: ClassVar[str] = NUM_LEARNER_UPDATES
    target_network_update_freq = 2
    tau = 0.5


# --- minibatch_sgd ---


def test_minibatch_sgd_runs_num_sgd_iter_epochs_of_shuffled_minibatches() -> None:
    policy = FakePolicy()
    stats = minibatch_sgd(policy, id_batch(40), num_sgd_iter=3, sgd_minibatch_size=10, seed=0)
    assert len(policy.calls) == 12 and all(len(c) == 10 for c in policy.calls)
    epochs = [np.concatenate(policy.calls[i : i + 4]) for i in range(0, 12, 4)]
    for epoch in epochs:
        assert sorted(epoch.tolist()) == list(range(40))  # every row once per epoch
    assert any(epoch.tolist() != list(range(40)) for epoch in epochs)  # shuffled
    assert stats == {"loss": pytest.approx(6.5), "rows": 10.0}  # mean of calls 1..12


@pytest.mark.parametrize(
    ("size", "per_epoch"),
    [(16, [16, 16, 8]), (12, [12, 12, 12]), (0, [40]), (40, [40]), (100, [40])],
)
def test_minibatch_sizes_and_the_skipped_short_tail(size: int, per_epoch: list[int]) -> None:
    policy = FakePolicy()
    minibatch_sgd(policy, id_batch(40), num_sgd_iter=2, sgd_minibatch_size=size)
    # A trailing minibatch smaller than half the size (40 % 12 = 4 < 6) is skipped.
    assert [len(c) for c in policy.calls] == per_epoch * 2


def test_minibatch_sgd_with_a_seed_is_reproducible() -> None:
    a, b = FakePolicy(), FakePolicy()
    minibatch_sgd(a, id_batch(30), 2, 10, seed=7)
    minibatch_sgd(b, id_batch(30), 2, 10, seed=7)
    assert [c.tolist() for c in a.calls] == [c.tolist() for c in b.calls]


# --- TrainOneStep ---


def test_train_one_step_counts_steps_records_info_and_timers_and_syncs_weights() -> None:
    workers = FakeWorkerSet()
    flow = from_list([id_batch(8), id_batch(6)]).for_each(TrainOneStep(workers))
    outputs = list(flow)
    metrics = flow.shared_metrics.get()
    assert metrics.counters[STEPS_TRAINED_COUNTER] == 14
    assert metrics.counters["num_agent_steps_trained"] == 14
    batch, info = outputs[1].batch, outputs[1].info
    assert batch.count == 6 and info == {DEFAULT_POLICY_ID: {"loss": 2.0, "rows": 6.0}}
    assert metrics.info[LEARNER_INFO] == info
    assert metrics.timers["learn"].count == 2 and metrics.timers["update"].count == 2
    assert metrics.timers["learn"].units == 14
    assert len(workers.syncs) == 2 and workers.syncs[0][0] == [DEFAULT_POLICY_ID]
    assert workers.syncs[0][1] == {"timestep": 0}
    assert len(workers.local.get_policy().calls) == 2


def test_train_one_step_with_epochs_calls_learn_on_batch_num_sgd_iter_times_per_minibatch() -> None:
    workers = FakeWorkerSet()
    op = TrainOneStep(workers, num_sgd_iter=3, sgd_minibatch_size=5)
    list(from_list([id_batch(20)]).for_each(op))
    calls = workers.local.get_policy().calls
    assert len(calls) == 3 * 4 and all(len(c) == 5 for c in calls)


def test_train_one_step_trains_only_the_selected_policies_of_a_multi_agent_batch() -> None:
    workers = FakeWorkerSet("p1", "p2")
    batch = MultiAgentBatch({"p1": id_batch(4), "p2": id_batch(6)}, env_steps=5)
    flow = from_list([batch]).for_each(TrainOneStep(workers, policies=["p2"]))
    info = next(flow).info
    assert set(info) == {"p2"}
    assert len(workers.local.get_policy("p1").calls) == 0 and len(workers.local.get_policy("p2").calls) == 1
    metrics = flow.shared_metrics.get()
    assert metrics.counters[STEPS_TRAINED_COUNTER] == 5 and metrics.counters["num_agent_steps_trained"] == 10
    assert workers.syncs[0][0] == ["p2"]


def test_train_one_step_yields_rllib_flows_batch_and_info(monkeypatch: pytest.MonkeyPatch) -> None:
    """``batch, info = next(rollouts.for_each(TrainOneStep(workers)))``, as in RLlib Flow: ``info`` is the
    per-policy stats; the priorities of replayed rows are its typed attribute, never one of its entries."""
    workers = FakeWorkerSet()
    batch, info = next(from_list([id_batch(4)]).for_each(TrainOneStep(workers)))
    assert batch.count == 4 and info == {DEFAULT_POLICY_ID: {"loss": 1.0, "rows": 4.0}}
    assert isinstance(info, LearnerInfo) and info.priorities == {}

    td_errors = np.array([0.5, -1.0, 2.0])
    policy = workers.local.get_policy()
    monkeypatch.setattr(policy, "learn", lambda rows: LearnOutput({"loss": 3.0}, td_errors))
    replayed = SampleBatch({"id": np.arange(3), "batch_indexes": np.array([7, 2, 9])})
    flow = from_list([replayed]).for_each(TrainOneStep(workers))
    trained = next(flow)
    batch, info = trained
    indexes, errors = info.priorities[DEFAULT_POLICY_ID]
    assert indexes.tolist() == [7, 2, 9] and errors is td_errors
    assert trained.priorities is info.priorities and dict(info) == {DEFAULT_POLICY_ID: {"loss": 3.0}}
    assert flow.shared_metrics.get().info[LEARNER_INFO] == {
        DEFAULT_POLICY_ID: {"loss": 3.0}
    }  # result["info"]["learner"]
    assert Trained(batch, cast(Any, {DEFAULT_POLICY_ID: {}})).priorities == {}  # a plain stats mapping has none


def test_train_one_step_takes_epochs_minibatches_and_seed_from_a_config() -> None:
    config = SimpleNamespace(num_sgd_iter=2, sgd_minibatch_size=5, seed=3)
    runs = []
    for _ in range(2):
        workers = FakeWorkerSet()
        list(from_list([id_batch(20)]).for_each(TrainOneStep(workers, None, config)))
        runs.append([c.tolist() for c in workers.local.get_policy().calls])
    assert len(runs[0]) == 2 * 4 and all(len(c) == 5 for c in runs[0])
    assert runs[0] == runs[1]  # shuffled by the config's seed
    with pytest.raises(FlowRLError, match="sgd_minibatch_size too"):
        TrainOneStep(FakeWorkerSet(), None, config, 10)


def test_train_one_step_learns_in_the_learner_group_of_its_resources() -> None:
    workers, group = FakeWorkerSet(), FakeLearnerGroup()
    op = TrainOneStep(workers, resources=PlanResources(learners=group))  # type: ignore[arg-type]
    batch, info = next(from_list([id_batch(4)]).for_each(op))
    assert info == {DEFAULT_POLICY_ID: {"loss": 0.5}} and workers.local.get_policy().calls == []
    assert group.learned[0]["policies"] == [DEFAULT_POLICY_ID] and len(workers.syncs) == 1
    assert ActorLink(LEARNER_ACTOR, "learn on batch shards") in op.plan_links() and op.plan_actor_counts() == {
        LEARNER_ACTOR: 2
    }
    assert TrainOneStep(workers, resources=PlanResources()).plan_actor_counts() == {}


def test_train_one_step_rejects_zero_epochs() -> None:
    with pytest.raises(FlowRLError, match="num_sgd_iter"):
        TrainOneStep(FakeWorkerSet(), num_sgd_iter=0)


def test_train_one_step_passes_the_sampled_timestep_to_the_workers() -> None:
    workers = FakeWorkerSet()

    def sampled(batch: SampleBatch) -> SampleBatch:
        LocalIterator.get_metrics().counters[STEPS_SAMPLED_COUNTER] += 123
        return batch

    list(from_list([id_batch(3)]).for_each(sampled).for_each(TrainOneStep(workers)))
    assert workers.syncs[0][1] == {"timestep": 123}


# --- gradients ---


def test_average_gradients_is_the_count_weighted_mean() -> None:
    g1 = [np.array([1.0, 2.0]), np.array([[0.0]])]
    g2 = [np.array([5.0, 6.0]), np.array([[8.0]])]
    averaged, total = AverageGradients()([ComputedGradients(g1, 1), ComputedGradients(g2, 3)])
    assert total == 4
    np.testing.assert_array_equal(averaged[0], [4.0, 5.0])
    np.testing.assert_array_equal(averaged[1], [[6.0]])


def test_average_gradients_of_one_item_is_that_item() -> None:
    g = [np.array([0.1, -0.3])]
    averaged, total = AverageGradients()([ComputedGradients(g, 7)])
    assert total == 7
    np.testing.assert_allclose(averaged[0], g[0], rtol=1e-15)


def test_average_gradients_of_nothing_raises() -> None:
    with pytest.raises(FlowRLError):
        AverageGradients()([])


def test_compute_gradients_yields_gradients_and_count() -> None:
    workers = FakeWorkerSet()
    flow = from_list([id_batch(5)]).for_each(ComputeGradients(workers))
    grads, count = next(flow)
    assert count == 5
    np.testing.assert_array_equal(grads[0], [5.0, 5.0])
    metrics = flow.shared_metrics.get()
    assert metrics.info[LEARNER_INFO] == {DEFAULT_POLICY_ID: {"grad_loss": 1.5}}
    assert metrics.timers["compute_grads"].count == 1


def test_apply_gradients_applies_counts_and_broadcasts_to_all() -> None:
    workers = FakeWorkerSet()
    grads = [np.ones(2)]
    flow = from_list([ComputedGradients(grads, 9)]).for_each(ApplyGradients(workers))
    next(flow)
    assert workers.local.applied == [(grads, DEFAULT_POLICY_ID)]
    assert flow.shared_metrics.get().counters[STEPS_TRAINED_COUNTER] == 9
    assert workers.syncs == [([DEFAULT_POLICY_ID], {"timestep": 0})]


def test_apply_gradients_to_the_source_worker_needs_a_source_actor() -> None:
    workers = FakeWorkerSet()
    flow = from_list([ComputedGradients([np.ones(2)], 1)]).for_each(ApplyGradients(workers, update_all=False))
    with pytest.raises(FlowRLError, match="source actor"):
        next(flow)


# --- UpdateTargetNetwork ---


def test_update_target_network_every_target_update_freq_sampled_steps() -> None:
    workers = FakeWorkerSet("p1", "p2")
    flow = from_list(range(10)).for_each(add_steps(sampled=10)).for_each(UpdateTargetNetwork(workers, 25))
    assert list(flow) == list(range(10))  # pass-through
    metrics = flow.shared_metrics.get()
    assert metrics.counters[NUM_TARGET_UPDATES] == 3  # at 30, 60 and 90 steps
    assert metrics.counters[LAST_TARGET_UPDATE_TS] == 90
    assert [workers.local.get_policy(p).target_updates for p in ("p1", "p2")] == [3, 3]


def test_update_target_network_by_steps_trained() -> None:
    workers = FakeWorkerSet()
    op = UpdateTargetNetwork(workers, 50, by_steps_trained=True)
    flow = from_list(range(6)).for_each(add_steps(sampled=1000, trained=20)).for_each(op)
    list(flow)
    metrics = flow.shared_metrics.get()
    assert metrics.counters[NUM_TARGET_UPDATES] == 2  # at 60 and 120 trained steps
    assert metrics.counters[LAST_TARGET_UPDATE_TS] == 120
    assert workers.local.get_policy().target_updates == 2


def test_update_target_network_reads_its_pace_from_a_config_and_its_lock_and_group_from_resources(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    workers, group, learner = FakeWorkerSet(), FakeLearnerGroup(), FakeLearnerThread()
    resources = PlanResources(learner=learner, learners=group)  # type: ignore[arg-type]
    op = UpdateTargetNetwork(workers, TargetConfig(), resources=resources)
    held: list[bool] = []

    def learner_update(item: int) -> int:
        LocalIterator.get_metrics().counters[NUM_LEARNER_UPDATES] += 1
        return item

    policy = workers.local.get_policy()
    update_target = policy.update_target

    def while_locked(tau: float = 1.0) -> None:  # the learner thread's lock is held while a target moves
        held.append(learner.lock.held)
        update_target(tau)

    monkeypatch.setattr(policy, "update_target", while_locked)
    list(from_list(range(5)).for_each(add_steps(sampled=100)).for_each(learner_update).for_each(op))
    assert policy.target_updates == 2 and policy.last_tau == 0.5  # at 2 and 4 learner updates, blended
    assert held == [True, True]
    assert group.target_updates == [([DEFAULT_POLICY_ID], 0.5)] * 2
    assert op.plan_links() == [ActorLink(LEARNER_ACTOR, "update target networks")]
    with pytest.raises(FlowRLError, match="drop by_steps_trained"):
        UpdateTargetNetwork(workers, TargetConfig(), by_steps_trained=True)


def test_update_target_network_only_for_the_given_policies() -> None:
    workers = FakeWorkerSet("p1", "p2")
    op = UpdateTargetNetwork(workers, 1, policies=["p2"])
    list(from_list(range(3)).for_each(add_steps(sampled=1)).for_each(op))
    assert [workers.local.get_policy(p).target_updates for p in ("p1", "p2")] == [0, 3]


def test_update_target_network_refuses_a_policy_without_a_target_when_the_plan_is_built() -> None:
    workers = FakeWorkerSet("p1", "p2")
    workers.local.policy_map["p2"] = cast(Any, object())
    with pytest.raises(
        FlowRLError, match="UpdateTargetNetwork needs policies with a target network; policy 'p2' is a object"
    ):
        UpdateTargetNetwork(workers, 1)
    UpdateTargetNetwork(workers, 1, policies=["p1"])  # only p1 is moved: fine
