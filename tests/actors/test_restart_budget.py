"""RestartBudget without Ray: a sliding window of restart times, its cap, its state and its backoff."""

from __future__ import annotations

import pytest
import ray

from flowrl.actors.restart_budget import RestartBudget
from flowrl.errors import ShardFailedError, WorkerFailureError

pytestmark = pytest.mark.unit


class Clock:
    """Wall-clock seconds that a test sets."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def budget(max_restarts: int | None, window_s: float, clock: Clock) -> RestartBudget:
    return RestartBudget("rollout worker", max_restarts, window_s, clock=clock)


def test_the_cap_is_reached_at_exactly_max_plus_one_restarts_within_the_window() -> None:
    clock = Clock()
    workers = budget(2, 60.0, clock)
    workers.spend("rollout worker 1 died", RuntimeError("first"))
    clock.now += 10
    workers.spend("rollout worker 2 died", RuntimeError("second"))
    assert workers.recent() == 2 and not workers.exhausted
    clock.now += 10
    with pytest.raises(WorkerFailureError) as info:
        workers.spend("rollout worker 1 died", RuntimeError("third"), worker_indices=[1])
    message = str(info.value)
    assert message.startswith("rollout worker 1 died, and the run already restarted rollout workers 2 times")
    assert "max_worker_restarts=2, restart_window_s=60" in message and message.endswith("Last failure:\nthird")
    assert info.value.worker_indices == [1] and isinstance(info.value.__cause__, RuntimeError)
    assert workers.exhausted and workers.recent() == 2  # a refused restart is not one more in the window


def test_restarts_older_than_the_window_no_longer_count() -> None:
    clock = Clock()
    workers = budget(2, 60.0, clock)
    workers.spend("a", RuntimeError())  # at 1000
    clock.now += 30
    workers.spend("b", RuntimeError())  # at 1030
    clock.now = 1_060.0  # the first is exactly one window old: out
    assert workers.recent() == 1
    workers.spend("c", RuntimeError())
    with pytest.raises(WorkerFailureError):
        workers.spend("d", RuntimeError())
    assert workers.exhausted
    clock.now = 1_090.5  # the one at 1030 is out, the one at 1060 still in
    workers.spend("e", RuntimeError())
    assert not workers.exhausted and workers.get_state() == [1_060.0, 1_090.5]


def test_max_zero_refuses_the_first_restart_and_none_means_no_cap() -> None:
    clock = Clock()
    with pytest.raises(WorkerFailureError, match="max_worker_restarts=0"):
        budget(0, 3_600.0, clock).spend("rollout worker 1 died", RuntimeError())
    unlimited = budget(None, float("inf"), clock)
    for _ in range(100):
        unlimited.spend("replay shard 0 died", RuntimeError())
    assert unlimited.recent() == 100


def test_the_window_round_trips_through_a_checkpoint_and_a_resumed_run_may_raise_the_cap() -> None:
    clock = Clock()
    before = budget(2, 600.0, clock)
    before.spend("a", RuntimeError())
    clock.now += 100
    before.spend("b", RuntimeError())
    with pytest.raises(WorkerFailureError):
        before.spend("c", RuntimeError())
    saved = before.get_state()
    assert saved == [1_000.0, 1_100.0]

    clock.now += 50  # the resumed run starts later, in another process, with the same cap: still out of restarts
    same_cap = budget(2, 600.0, clock)
    same_cap.set_state(saved)
    with pytest.raises(WorkerFailureError):
        same_cap.spend("c", RuntimeError())

    raised = budget(10, 600.0, clock)  # --resume ... --set max_worker_restarts=10
    raised.set_state(saved)
    assert raised.recent() == 2
    for _ in range(8):
        raised.spend("c", RuntimeError())
    with pytest.raises(WorkerFailureError, match="restarted rollout workers 10 times"):
        raised.spend("d", RuntimeError())

    clock.now = 1_000.0 + 600.0  # the first saved restart aged out before the next resume
    later = budget(2, 600.0, clock)
    later.set_state(saved)
    assert later.get_state() == [1_100.0]


def test_backoff_grows_while_a_slots_replacements_fail_to_start() -> None:
    workers = budget(None, 60.0, Clock())
    init_failed = ray.exceptions.RayActorError(actor_init_failed=True)
    crashed = ray.exceptions.RayActorError()
    assert workers.backoff(1, crashed) == 0.0  # a worker that ran is replaced at once
    assert [workers.backoff(1, init_failed) for _ in range(3)] == [1.0, 2.0, 4.0]
    assert workers.backoff(2, init_failed) == 1.0  # each slot counts its own
    # As a gather reports it: the actor's error is the cause of a ShardFailedError.
    reported = ShardFailedError("shard 0 died", shard_index=0, reason="died")
    reported.__cause__ = init_failed
    assert workers.backoff(1, reported) == 8.0
    assert workers.backoff(1, crashed) == 0.0
