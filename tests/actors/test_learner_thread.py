"""LearnerThread: results in order, back-pressure, stopping, failures reaching the driver, timers (no Ray)."""

from __future__ import annotations

import threading
import time
import types
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from fakes import bc_loss, from_list

from flowrl.actors import Learned, LearnerThread, RolloutWorker, learn_on_local_worker
from flowrl.config import TrainerConfig
from flowrl.data import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch
from flowrl.envs import get_env_creator
from flowrl.errors import FlowRLError, LearnerThreadError
from flowrl.iterators import EventQueue, FromActor, NextValueNotReady
from flowrl.operators import Concurrently, Dequeue, Enqueue
from flowrl.policy import LearnOutput, PolicySpec, TorchPolicy

pytestmark = pytest.mark.unit


def make_batch(n: int) -> SampleBatch:
    """``n`` rows, replayed from rows 100.. of a buffer (``batch_indexes``)."""
    columns = {SampleBatch.OBS: np.zeros((n, 2), np.float32), SampleBatch.REWARDS: np.ones(n, np.float32)}
    return SampleBatch({**columns, "batch_indexes": 100 + np.arange(n)})


class FakeWorker:
    """Records learn calls; can block on ``gate`` and fail on its ``fail_at``-th call."""

    def __init__(
        self, *, gate: threading.Event | None = None, fail_at: int | None = None, delay_s: float = 0.0
    ) -> None:
        self.calls: list[tuple[str, int]] = []
        self.gate = gate
        self.fail_at = fail_at
        self.delay_s = delay_s

    def get_policy(self, policy_id: str = DEFAULT_POLICY_ID) -> Any:
        return types.SimpleNamespace(learn=lambda batch: self.learn(batch, policy_id))

    def learn(self, batch: SampleBatch, policy_id: str = DEFAULT_POLICY_ID) -> LearnOutput:
        self.calls.append((policy_id, batch.count))
        if self.gate is not None:
            assert self.gate.wait(timeout=20), "test gate never opened"
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail_at is not None and len(self.calls) == self.fail_at:
            explode_in_the_loss(batch)
        return LearnOutput({"loss": float(batch.count)}, np.arange(batch.count, dtype=np.float32))


def explode_in_the_loss(batch: SampleBatch) -> None:
    raise ValueError(f"loss is NaN on a batch of {batch.count} rows")


@pytest.fixture
def learners() -> Any:
    """Builds learner threads and stops every one of them after the test."""
    made: list[LearnerThread] = []

    def make(worker: Any, **kwargs: Any) -> LearnerThread:
        learner = LearnerThread(worker, **kwargs)
        made.append(learner)
        return learner

    yield make
    for learner in made:
        learner.stop()


# --- results ---


@pytest.mark.timeout(30)
def test_results_come_out_in_order_with_their_source_and_counts(learners: Any) -> None:
    worker = FakeWorker()
    learner = learners(worker)
    learner.start()
    for source, n in [("actor-a", 3), ("actor-b", 5), ("actor-a", 2)]:
        learner.inqueue.put(FromActor(source, make_batch(n)))
    results = [learner.outqueue.get(timeout=10) for _ in range(3)]

    assert [(r.source, r.steps) for r in results] == [("actor-a", 3), ("actor-b", 5), ("actor-a", 2)]
    info = results[1].info
    assert set(info) == {DEFAULT_POLICY_ID}
    assert info[DEFAULT_POLICY_ID]["loss"] == 5.0
    indexes, td_error = results[1].priorities[DEFAULT_POLICY_ID]  # the replayed rows' new priorities
    np.testing.assert_array_equal(td_error, np.arange(5))
    np.testing.assert_array_equal(indexes, 100 + np.arange(5))
    assert worker.calls == [(DEFAULT_POLICY_ID, 3), (DEFAULT_POLICY_ID, 5), (DEFAULT_POLICY_ID, 2)]
    assert learner.num_steps_trained == 10
    assert learner.num_batches_trained == 3
    assert learner.learner_info is results[-1].info
    assert learner.check() is True


@pytest.mark.timeout(30)
def test_a_multi_agent_batch_trains_each_policy_and_counts_env_steps(learners: Any) -> None:
    worker = FakeWorker()
    learner = learners(worker)
    learner.start()
    batch = MultiAgentBatch({"p0": make_batch(4), "p1": make_batch(6)}, env_steps=5)
    learner.inqueue.put(FromActor("actor", batch))
    learned = learner.outqueue.get(timeout=10)

    assert (learned.source, learned.steps) == ("actor", 5)
    assert sorted(worker.calls) == [("p0", 4), ("p1", 6)]
    assert set(learned.info) == {"p0", "p1"} and learned.priorities["p1"][1].shape == (6,)


@pytest.mark.timeout(30)
def test_a_custom_learn_fn_gets_the_worker_and_batch_and_its_result_passes_through(learners: Any) -> None:
    worker = FakeWorker()
    seen: list[tuple[Any, int]] = []

    def learn_fn(w: Any, batch: SampleBatch) -> Learned:
        seen.append((w, batch.count))
        return Learned(None, {"custom": {"n": batch.count}}, 2 * batch.count)

    learner = learners(worker, learn_fn=learn_fn)
    learner.start()
    learner.inqueue.put(make_batch(3))
    assert learner.outqueue.get(timeout=10) == Learned(None, {"custom": {"n": 3}}, 6)
    assert seen == [(worker, 3)] and worker.calls == []
    assert learner.num_steps_trained == 6


@pytest.mark.timeout(60)
def test_learns_on_a_real_rollout_worker(learners: Any) -> None:
    env = gym.make("CartPole-v1")
    spec = PolicySpec(TorchPolicy, env.observation_space, env.action_space, TrainerConfig(), {"loss_fn": bc_loss})
    worker = RolloutWorker(
        env_creator=get_env_creator("CartPole-v1"),
        policy_specs={DEFAULT_POLICY_ID: spec},
        config={"seed": 0, "rollout_fragment_length": 32},
    )
    before = {k: np.copy(v) for k, v in worker.get_policy().get_weights().items()}
    learner = learners(worker)
    learner.start()
    learner.inqueue.put(FromActor("local", worker.sample()))
    learned = learner.outqueue.get(timeout=30)

    assert (learned.source, learned.steps) == ("local", 32)
    assert isinstance(learned.info[DEFAULT_POLICY_ID], dict)
    after = worker.get_policy().get_weights()
    assert any(not np.array_equal(before[k], np.asarray(after[k])) for k in before)


def test_queue_sizes_are_checked() -> None:
    with pytest.raises(FlowRLError, match="inqueue_size=-1"):
        LearnerThread(FakeWorker(), inqueue_size=-1)


# --- back-pressure ---


@pytest.mark.timeout(30)
def test_a_full_inqueue_makes_enqueue_wait_and_drops_nothing(learners: Any) -> None:
    learner = learners(FakeWorker(), inqueue_size=2)
    flow = from_list([FromActor(f"actor-{i}", make_batch(i + 1)) for i in range(6)]).transform(Enqueue(learner.inqueue))
    assert [next(flow)[0], next(flow)[0]] == ["actor-0", "actor-1"]
    marker = next(flow)
    assert isinstance(marker, NextValueNotReady) and learner.inqueue.not_full_event in marker.events
    assert isinstance(next(flow), NextValueNotReady)  # still full: the item is kept, not dropped
    assert learner.inqueue.qsize() == 2

    learner.start()
    passed: list[str] = []
    for item in flow:
        if isinstance(item, NextValueNotReady):
            item.events[0].wait(timeout=5)
        else:
            passed.append(item[0])
    assert passed == ["actor-2", "actor-3", "actor-4", "actor-5"]
    results = [learner.outqueue.get(timeout=10) for _ in range(6)]
    assert [(r.source, r.steps) for r in results] == [(f"actor-{i}", i + 1) for i in range(6)]


@pytest.mark.timeout(30)
def test_a_busy_learner_holds_back_the_producer(learners: Any) -> None:
    gate = threading.Event()
    worker = FakeWorker(gate=gate)
    learner = learners(worker, inqueue_size=1)
    learner.start()
    learner.inqueue.put(FromActor("a", make_batch(1)))
    deadline = time.monotonic() + 10
    while not worker.calls and time.monotonic() < deadline:  # the learner took it and is stuck learning
        time.sleep(0.01)
    learner.inqueue.put(FromActor("b", make_batch(1)))
    flow = from_list([FromActor("c", make_batch(1))]).transform(Enqueue(learner.inqueue))
    assert isinstance(next(flow), NextValueNotReady)
    gate.set()
    item = next(flow)
    while isinstance(item, NextValueNotReady):
        item.events[0].wait(timeout=5)
        item = next(flow)
    assert item[0] == "c"
    assert [learner.outqueue.get(timeout=10)[0] for _ in range(3)] == ["a", "b", "c"]


# --- stopping ---


@pytest.mark.timeout(30)
def test_stop_ends_an_idle_thread_promptly_and_is_idempotent(learners: Any) -> None:
    learner = learners(FakeWorker())
    learner.start()
    assert learner.check() is True
    assert learner.stop(timeout=2.0)  # waits on its inqueue for at most poll_interval_s at a time
    assert not learner.is_alive()
    assert learner.stop() and learner.stop(timeout=0)
    assert learner.check() is False


@pytest.mark.timeout(30)
def test_a_dequeue_drains_results_of_a_stopped_learner_then_raises(learners: Any) -> None:
    learner = learners(FakeWorker())
    learner.start()
    learner.inqueue.put(FromActor("a", make_batch(2)))
    source = Dequeue(learner.outqueue, check=learner.check)
    assert next(source)[0] == "a"
    learner.stop()
    with pytest.raises(FlowRLError, match="check"):
        next(source)


def test_stop_before_start_is_allowed() -> None:
    learner = LearnerThread(FakeWorker())
    assert learner.stop()
    assert learner.check() is False


def test_check_on_a_thread_never_started_says_so() -> None:
    with pytest.raises(FlowRLError, match="never started"):
        LearnerThread(FakeWorker()).check()


# --- failures ---


def assert_carries_the_original(error: LearnerThreadError) -> None:
    text = str(error)
    assert "ValueError" in text
    assert "loss is NaN on a batch of 7 rows" in text
    assert "Traceback" in text and "explode_in_the_loss" in text  # the learner thread's traceback
    assert isinstance(error.__cause__, ValueError)
    assert str(error.__cause__) == "loss is NaN on a batch of 7 rows"


@pytest.mark.timeout(30)
def test_a_failure_in_learning_surfaces_through_check(learners: Any) -> None:
    learner = learners(FakeWorker(fail_at=1))
    learner.start()
    learner.inqueue.put(FromActor("a", make_batch(7)))
    learner.join(timeout=10)
    assert not learner.is_alive()  # the thread ended
    with pytest.raises(LearnerThreadError) as caught:
        learner.check()
    assert_carries_the_original(caught.value)
    assert isinstance(learner.error, ValueError)
    assert learner.outqueue.empty() and learner.num_steps_trained == 0
    with pytest.raises(LearnerThreadError):  # keeps failing, and stop() does not hide it
        learner.stop()
        learner.check()


def fail_later(learner: LearnerThread, gate: threading.Event, delay_s: float) -> None:
    """Feed one good batch, then one that fails once ``gate`` opens after ``delay_s``."""
    learner.inqueue.put(FromActor("good", make_batch(3)))
    learner.inqueue.put(FromActor("bad", make_batch(7)))
    threading.Timer(delay_s, gate.set).start()


class GatedFailure(FakeWorker):
    """Learns the first batch at once, then waits on the gate and fails."""

    def __init__(self, gate: threading.Event) -> None:
        super().__init__(fail_at=2)
        self.second_gate = gate

    def learn(self, batch: SampleBatch, policy_id: str = DEFAULT_POLICY_ID) -> LearnOutput:
        if self.calls:
            assert self.second_gate.wait(timeout=20)
        return super().learn(batch, policy_id)


@pytest.mark.timeout(30)
def test_a_blocking_dequeue_raises_the_learners_failure_instead_of_hanging(learners: Any) -> None:
    gate = threading.Event()
    learner = learners(GatedFailure(gate))
    learner.start()
    source = Dequeue(learner.outqueue, check=learner.check)
    fail_later(learner, gate, delay_s=0.3)
    assert next(source)[0] == "good"
    start = time.monotonic()
    with pytest.raises(LearnerThreadError) as caught:
        next(source)  # blocks on the empty outqueue until the failure is seen
    assert time.monotonic() - start < 5
    assert_carries_the_original(caught.value)


@pytest.mark.timeout(30)
def test_an_async_union_waiting_only_on_the_learner_raises_its_failure(learners: Any) -> None:
    gate = threading.Event()
    learner = learners(GatedFailure(gate))
    learner.start()
    out = Concurrently([Dequeue(learner.outqueue, check=learner.check), from_list(["first"])], mode="async")
    assert next(out) == "first"
    fail_later(learner, gate, delay_s=0.3)
    assert next(out)[0] == "good"
    start = time.monotonic()
    with pytest.raises(LearnerThreadError) as caught:
        next(out)
    assert time.monotonic() - start < 5
    assert_carries_the_original(caught.value)


@pytest.mark.timeout(30)
def test_an_impala_style_plan_raises_the_learners_failure(learners: Any) -> None:
    """Samples -> Enqueue(inqueue) and Dequeue(outqueue), merged asynchronously as in IMPALA."""
    learner = learners(FakeWorker(fail_at=3))
    learner.start()
    samples: EventQueue[FromActor] = EventQueue()
    for i, n in enumerate([3, 4, 7]):
        samples.put(FromActor(f"actor-{i}", make_batch(n)))
    enqueue_op = Dequeue(samples).transform(Enqueue(learner.inqueue))  # the sampling side stays open
    dequeue_op = Dequeue(learner.outqueue, check=learner.check)
    plan = Concurrently([enqueue_op, dequeue_op], mode="async", output_indexes=[1])

    assert [next(plan)[2], next(plan)[2]] == [3, 4]
    start = time.monotonic()
    with pytest.raises(LearnerThreadError) as caught:
        next(plan)
    assert time.monotonic() - start < 5
    assert_carries_the_original(caught.value)


# --- timers and stats ---


@pytest.mark.timeout(30)
def test_timers_record_the_wait_for_batches_and_the_learning(learners: Any) -> None:
    learner = learners(FakeWorker(delay_s=0.05))
    learner.start()
    threading.Timer(0.2, lambda: learner.inqueue.put(FromActor("a", make_batch(4)))).start()
    learner.outqueue.get(timeout=10)
    learner.inqueue.put(FromActor("b", make_batch(6)))
    learner.outqueue.get(timeout=10)

    assert learner.queue_timer.count == 2  # one wait per batch, however many polls it took
    assert learner.queue_timer.total_s >= 0.15
    assert learner.learn_timer.count == 2
    assert learner.learn_timer.units == 10
    assert learner.learn_timer.mean >= 0.04
    stats = learner.stats()
    assert stats["num_steps_trained"] == 10 and stats["num_batches_trained"] == 2
    assert stats["inqueue_size"] == 0 and stats["inqueue_capacity"] == 16 and stats["outqueue_size"] == 0
    assert stats["queue_wait_mean_s"] == learner.queue_timer.mean > 0
    assert stats["learn_time_mean_s"] == learner.learn_timer.mean
    assert 0 < stats["learn_throughput"] == learner.learn_timer.mean_throughput
    assert stats["alive"] and not stats["failed"]


class RecordingPolicy:
    """Stands in for a policy: records the rows of each minibatch it learns on."""

    def __init__(self) -> None:
        self.calls: list[np.ndarray] = []

    def learn_on_batch(self, batch: SampleBatch) -> dict[str, float]:
        self.calls.append(np.asarray(batch[SampleBatch.OBS][:, 0]))
        return {"loss": 1.0}

    def learn(self, batch: SampleBatch) -> LearnOutput:
        return LearnOutput(self.learn_on_batch(batch))


class MinibatchWorker:
    def __init__(self) -> None:
        self.policy = RecordingPolicy()

    def get_policy(self, policy_id: str = DEFAULT_POLICY_ID) -> RecordingPolicy:
        return self.policy


@pytest.mark.timeout(30)
def test_minibatch_epochs_keep_whole_fragments_together(learners: Any) -> None:
    worker = MinibatchWorker()
    learner = learners(worker, num_sgd_iter=3, sgd_minibatch_size=20, sequence_length=10)
    learner.start()
    rows = np.arange(60, dtype=np.float32)
    learner.inqueue.put(SampleBatch({SampleBatch.OBS: np.stack([rows, rows], axis=1)}))
    learned = learner.outqueue.get(timeout=10)

    assert learned.steps == 60 and learned.info[DEFAULT_POLICY_ID] == {"loss": 1.0}
    calls = worker.policy.calls
    assert len(calls) == 9 and all(len(c) == 20 for c in calls)  # 3 epochs of 3 minibatches
    for epoch in range(3):
        seen = np.concatenate(calls[3 * epoch : 3 * epoch + 3])
        assert sorted(seen.tolist()) == rows.tolist()
        # Each run of 10 rows is one fragment, in its own order.
        for run in seen.reshape(-1, 10):
            assert run[0] % 10 == 0 and np.array_equal(run, run[0] + np.arange(10))
    assert any(not np.array_equal(np.concatenate(calls[i : i + 3]), rows) for i in (0, 3, 6))


def test_minibatch_settings_are_checked() -> None:
    with pytest.raises(FlowRLError, match="num_sgd_iter=0"):
        LearnerThread(FakeWorker(), num_sgd_iter=0)
    with pytest.raises(FlowRLError, match="sequence_length=0"):
        LearnerThread(FakeWorker(), sequence_length=0)


@pytest.mark.timeout(30)
def test_only_the_policies_to_train_learn(learners: Any) -> None:
    worker = FakeWorker()
    learner = learners(worker, policies=["p1"])
    learner.start()
    learner.inqueue.put(MultiAgentBatch({"p0": make_batch(4), "p1": make_batch(6)}, env_steps=5))
    info = learner.outqueue.get(timeout=10).info
    assert set(info) == {"p1"} and worker.calls == [("p1", 6)]


def test_a_custom_learn_fn_excludes_the_sgd_settings() -> None:
    with pytest.raises(FlowRLError, match="custom learn_fn"):
        LearnerThread(FakeWorker(), learn_fn=learn_on_local_worker, num_sgd_iter=2)


@pytest.mark.timeout(30)
def test_a_stuck_learner_is_reported_after_timeout_s_instead_of_waited_on(learners: Any) -> None:
    gate = threading.Event()  # never opened during the check: the learning step is stuck
    learner = learners(FakeWorker(gate=gate), timeout_s=0.5)
    learner.start()
    source = Dequeue(learner.outqueue, check=learner.check)
    learner.inqueue.put(FromActor("a", make_batch(3)))
    with pytest.raises(LearnerThreadError, match=r"learning on one batch for over 0.5 s \(learner_timeout_s\)"):
        next(source)
    gate.set()  # let the thread finish so the fixture can stop it


@pytest.mark.timeout(30)
def test_a_slow_but_moving_learner_is_not_reported(learners: Any) -> None:
    learner = learners(FakeWorker(delay_s=0.05), timeout_s=5.0)
    learner.start()
    source = Dequeue(learner.outqueue, check=learner.check)
    for _ in range(3):
        learner.inqueue.put(FromActor("a", make_batch(3)))
    assert [next(source).source for _ in range(3)] == ["a", "a", "a"]
