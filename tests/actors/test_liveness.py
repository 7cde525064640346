"""Liveness rules for rollout workers (progress, not deadlines) and the slow-worker report, with fakes."""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest

from flowrl.actors.liveness import (
    ANSWER_WAIT_S,
    HEARTBEAT_S,
    STOPPED_GRACE_S,
    LivenessMonitor,
    Progress,
    ProgressCounter,
    SlowWorkers,
    process_state,
)
from flowrl.errors import RunWarning

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeWorker:
    """What a probe of it answers: a progress, nothing yet (None), or an error; and whether it is stopped."""

    def __init__(self) -> None:
        self.answer: Any = None
        self.stopped = False
        self.asked = 0


def monitor(clock: Clock, no_progress_s: float = 10.0, unresponsive_s: float = 60.0) -> LivenessMonitor:
    def ask(worker: FakeWorker) -> FakeWorker:
        worker.asked += 1
        return worker  # the probe's handle: the worker, whose answer the test sets

    return LivenessMonitor(
        no_progress_s,
        unresponsive_s,
        ask=ask,
        answer=lambda worker: worker.answer,
        stopped=lambda worker: worker.stopped,
        clock=clock,
    )


def test_a_worker_that_keeps_stepping_is_alive_however_long_its_fragment() -> None:
    clock, worker = Clock(), FakeWorker()
    liveness = monitor(clock)
    for _ in range(5):  # far past sample_timeout_s in all
        assert liveness.check(worker) == ANSWER_WAIT_S  # probe sent
        clock.now += 0.5
        worker.answer = Progress(env_steps=100, idle_s=3.0)
        assert liveness.check(worker) == pytest.approx(7.0)  # checked again once 10 s may pass without a step
        clock.now += 7.0
        worker.answer = None


def test_a_worker_that_answers_promptly_without_stepping_is_hung() -> None:
    clock, worker = Clock(), FakeWorker()
    liveness = monitor(clock)
    liveness.check(worker)
    worker.answer = Progress(env_steps=5, idle_s=10.5)
    clock.now += 0.2
    assert liveness.check(worker) is None
    assert "no env step for 10.5 s" in liveness.reason and "sample_timeout_s=10" in liveness.reason


def test_a_probe_about_an_earlier_request_is_not_used_for_a_later_one() -> None:
    clock, worker = Clock(), FakeWorker()
    liveness = monitor(clock)
    assert liveness.check(worker, since=90.0) == ANSWER_WAIT_S  # probe sent at 100 about a request of 90
    worker.answer = Progress(env_steps=5, idle_s=12.0)  # it answered: stuck then; that request's item came since
    clock.now = 130.0
    assert liveness.check(worker, since=120.0) == ANSWER_WAIT_S  # a new request: a new probe, not the old answer
    assert worker.asked == 2


def test_a_held_up_heartbeat_means_the_gil_was_held_and_the_worker_is_busy() -> None:
    clock, worker = Clock(), FakeWorker()
    liveness = monitor(clock)
    liveness.check(worker)
    for _ in range(15):  # an env step holds the GIL for 15 s: no answer meanwhile, not stopped
        clock.now += 1.0
        assert liveness.check(worker) == ANSWER_WAIT_S
    worker.answer = Progress(env_steps=5, idle_s=15.0, held_s=14.8)  # answered once the GIL was released
    clock.now += 0.5
    assert liveness.check(worker) == 10.0
    assert worker.asked == 1


def test_a_slow_answer_with_a_steady_heartbeat_is_not_mistaken_for_a_held_gil() -> None:
    clock, worker = Clock(), FakeWorker()
    liveness = monitor(clock)
    liveness.check(worker)
    clock.now += 5.0  # a loaded machine: the answer takes long, but the heartbeat kept time
    worker.answer = Progress(env_steps=5, idle_s=12.0, held_s=0.1)
    assert liveness.check(worker) is None


def test_the_heartbeat_reports_its_longest_delay_once() -> None:
    clock = Clock()
    counter = ProgressCounter(clock)
    counter._beat = clock.now  # as start_heartbeat does, without its thread
    clock.now += HEARTBEAT_S
    counter.beat()
    clock.now += HEARTBEAT_S + 3.0  # held up 3 s
    counter.beat()
    clock.now += HEARTBEAT_S
    counter.beat()
    assert counter.read().held_s == pytest.approx(3.0)
    assert counter.read().held_s == pytest.approx(0.0)


def test_a_silent_worker_is_hung_after_worker_unresponsive_timeout_s() -> None:
    clock, worker = Clock(), FakeWorker()
    liveness = monitor(clock, unresponsive_s=60.0)
    liveness.check(worker)
    clock.now += 59.5
    assert liveness.check(worker) == pytest.approx(0.5)
    clock.now += 0.5
    assert liveness.check(worker) is None
    assert "did not answer for 60 s" in liveness.reason


def test_a_stopped_process_is_hung_after_a_short_grace() -> None:
    clock, worker = Clock(), FakeWorker()
    worker.stopped = True
    liveness = monitor(clock)
    liveness.check(worker)
    clock.now += STOPPED_GRACE_S - 0.1
    assert liveness.check(worker) == ANSWER_WAIT_S
    clock.now += 0.1
    assert liveness.check(worker) is None and "stopped" in liveness.reason


def test_a_dead_worker_is_hung_and_a_forgotten_one_is_probed_afresh() -> None:
    clock, worker = Clock(), FakeWorker()
    liveness = monitor(clock)
    liveness.check(worker)
    worker.answer = RuntimeError("actor died")
    assert liveness.check(worker) is None and "died" in liveness.reason
    liveness.check(worker)
    liveness.forget(worker)
    liveness.check(worker)
    assert worker.asked == 3


def test_progress_counter_reports_steps_idle_time_and_seconds_per_fragment() -> None:
    clock = Clock()
    counter = ProgressCounter(clock)
    assert counter.pop_fragment_s() is None  # not sampled
    counter.sample_started()
    clock.now += 2.0
    counter.step()
    clock.now += 1.0
    assert counter.read() == Progress(1, 1.0, 0.0)
    assert counter.pop_fragment_s() == 3.0  # in progress: a lower bound
    counter.sample_ended()
    counter.sample_started()
    clock.now += 5.0
    counter.sample_ended()
    assert counter.pop_fragment_s() == pytest.approx(4.0)  # (3 + 5) / 2
    assert counter.pop_fragment_s() is None


def test_slow_workers_are_counted_and_warned_about_once_per_episode_of_slowness() -> None:
    slow = SlowWorkers(5.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert slow.update({1: 0.1, 2: 0.12, 3: 0.7}) == 1  # 0.7 > 5 x median(0.1, 0.12)
        assert slow.update({1: 0.1, 2: 0.12, 3: 0.8}) == 1
        assert slow.update({1: 0.1, 2: 0.12, 3: None}) == 1  # no fragment this time: still slow
        assert slow.update({1: 0.1, 2: 0.12, 3: 0.2}) == 0  # caught up
        assert slow.update({1: 0.1, 2: 0.12, 3: 0.9}) == 1  # slow again: warned again
    messages = [str(w.message) for w in caught if issubclass(w.category, RunWarning)]
    assert len(messages) == 2
    assert "rollout worker 3 is slow: 0.70 s per fragment" in messages[0] and "0.11 s" in messages[0]
    assert "0.90 s" in messages[1]


def test_a_slow_worker_that_gets_much_slower_is_warned_about_again_with_the_new_time() -> None:
    slow = SlowWorkers(5.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        slow.update({1: 0.3, 2: 0.05})  # slow: warned
        slow.update({1: 0.5, 2: 0.05})  # slower, but less than twice as slow: not again
        slow.update({1: 15.0, 2: 0.05})  # 30 times its first time (an env step holding the GIL): warned again
    messages = [str(w.message) for w in caught if issubclass(w.category, RunWarning)]
    assert len(messages) == 2 and "0.30 s per fragment" in messages[0] and "15.00 s per fragment" in messages[1]


def test_a_lone_worker_is_never_slow() -> None:
    assert SlowWorkers(5.0).update({1: 100.0}) == 0
    assert SlowWorkers(5.0).update({1: 0.002, 2: 0.003, 3: 0.2}) == 0  # milliseconds apart: noise, not a straggler


def test_process_state_reads_proc() -> None:
    assert process_state(os.getpid()) == "R"  # this process, reading its own state, runs
    assert process_state(2**22 + 12345) is None
