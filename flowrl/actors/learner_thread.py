"""The background learner of asynchronous plans (Ape-X, IMPALA, APPO).

In those architectures sampling and replay never wait for gradient steps: the driver
hands batches to a learner thread through a bounded queue and collects what the
thread learned, as :class:`~flowrl.actors.Learned` items, from a second queue. The plan writes
``Enqueue(learner.inqueue)`` on one side and ``Dequeue(learner.outqueue, check=learner.check)``
on the other; ``check`` carries a failure of the thread into the driver's thread as a
:class:`~flowrl.errors.LearnerThreadError`.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from flowrl.actors.learned import Learned
from flowrl.data import (
    MultiAgentBatch,
    SampleBatch,
    as_policy_batches,
)
from flowrl.data.replay_buffer import BATCH_INDEXES
from flowrl.errors import FlowRLError, LearnerThreadError
from flowrl.iterators import EventQueue, FromActor, TimerStat
from flowrl.policy.sgd import minibatch_sgd

if TYPE_CHECKING:
    from flowrl.actors.protocols import PolicyHolder

logger = logging.getLogger(__name__)

Batch = SampleBatch | MultiAgentBatch


class GroupLearner(Protocol):
    """What a learner thread asks of the learner group it learns in: a :class:`~flowrl.actors.LearnerGroup`,
    named by this Protocol so that the two modules do not import each other."""

    @property
    def size(self) -> int:
        """How many learners the group has."""

    @property
    def update_limit_s(self) -> float:
        """The longest one :meth:`learn` can take."""

    def learn(
        self,
        batch: Batch,
        *,
        policies: Sequence[str] | None = None,
        num_sgd_iter: int = 1,
        sgd_minibatch_size: int = 0,
        seed: int | list[int] | None = None,
        sequence_length: int = 1,
    ) -> Learned:
        """Learn on ``batch`` across the group; the local worker's policies take the result."""


LearnFn = Callable[["PolicyHolder", Batch], Learned]


def learn_on_local_worker(
    worker: PolicyHolder,
    batch: Batch,
    *,
    policies: Sequence[str] | None = None,
    num_sgd_iter: int = 1,
    sgd_minibatch_size: int = 0,
    sequence_length: int = 1,
    seed: int | list[int] | None = None,
) -> Learned:
    """Learn on ``batch`` with each of its policies on ``worker`` (only ``policies``, if given).

    One gradient step per policy by default; with ``num_sgd_iter`` > 1 or a
    ``sgd_minibatch_size``, that many epochs of minibatches shuffled with ``seed``, keeping
    runs of ``sequence_length`` rows whole (see :func:`flowrl.policy.sgd.minibatch_sgd`).
    A plain :class:`~flowrl.data.SampleBatch` trains the default policy. A single step on
    replayed rows (a ``batch_indexes`` column) whose loss gives TD errors yields their new
    priorities. The result's ``source`` is None.
    """
    info: dict[str, dict[str, float]] = {}
    priorities: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for pid, policy_batch in as_policy_batches(batch).items():
        if policies is not None and pid not in policies:
            continue
        policy = worker.get_policy(pid)
        if num_sgd_iter == 1 and sgd_minibatch_size == 0:
            out = policy.learn(policy_batch)
            info[pid] = out.stats
            if out.td_error is not None and BATCH_INDEXES in policy_batch:
                priorities[pid] = (policy_batch[BATCH_INDEXES], out.td_error)
        else:
            info[pid] = minibatch_sgd(policy, policy_batch, num_sgd_iter, sgd_minibatch_size, seed, sequence_length)
    return Learned(None, info, batch.env_steps(), priorities)


def learn_in_group(
    learners: GroupLearner,
    worker: PolicyHolder,
    batch: Batch,
    *,
    policies: Sequence[str] | None = None,
    **settings: Any,
) -> Learned:
    """:func:`learn_on_local_worker` done by a learner group: it learns data-parallel and ``worker``'s
    policies take rank 0's weights (see :meth:`~flowrl.actors.LearnerGroup.learn`)."""
    return learners.learn(batch, policies=policies, **settings)


class LearnerThread(threading.Thread):
    """A daemon thread that learns, on ``local_worker``, from the batches put on its inqueue.

    ``inqueue`` (bounded by ``inqueue_size``; back-pressure for ``Enqueue``) takes batches,
    or ``FromActor(actor, batch)`` items to remember where each batch came from (a replay
    shard, for its priorities); for each one the thread calls
    ``learn_fn(local_worker, batch) -> Learned`` and puts the :class:`Learned` result, its
    ``source`` set to that actor, on ``outqueue`` (``outqueue_size=0``: unbounded). The
    default ``learn_fn`` is :func:`learn_on_local_worker` with ``policies``,
    ``num_sgd_iter``, ``sgd_minibatch_size`` and ``sequence_length`` (which a custom
    ``learn_fn`` must not be combined with), or with ``learners`` the same done by that
    learner group (:func:`learn_in_group`).

    If ``learn_fn`` raises, the thread records the error and ends; :meth:`check` then
    raises it in the caller's thread, as it does when one ``learn_fn`` call has run longer
    than ``timeout_s`` (a stuck learner is reported, not waited on forever); with a learner
    group, longer than the group's own limit if that is larger (it rebuilds itself within it).
    """

    #: Longest wait on an empty inqueue (or a full outqueue) before re-reading the stop flag.
    poll_interval_s = 0.2

    def __init__(
        self,
        local_worker: PolicyHolder,
        *,
        inqueue_size: int = 16,
        outqueue_size: int = 0,
        learn_fn: LearnFn | None = None,
        policies: Sequence[str] | None = None,
        num_sgd_iter: int = 1,
        sgd_minibatch_size: int = 0,
        sequence_length: int = 1,
        timeout_s: float | None = None,
        name: str = "learner",
        learners: GroupLearner | None = None,
    ) -> None:
        if inqueue_size < 0 or outqueue_size < 0:
            raise FlowRLError(
                f"LearnerThread(inqueue_size={inqueue_size}, outqueue_size={outqueue_size}): "
                "queue sizes must be >= 0 (0 = unbounded)"
            )
        if learn_fn is not None and (
            policies is not None
            or learners is not None
            or (num_sgd_iter, sgd_minibatch_size, sequence_length) != (1, 0, 1)
        ):
            raise FlowRLError(
                "LearnerThread: a custom learn_fn decides itself what to learn; "
                "drop policies, learners and the SGD settings"
            )
        if num_sgd_iter < 1 or sgd_minibatch_size < 0 or sequence_length < 1:
            raise FlowRLError(
                f"LearnerThread(num_sgd_iter={num_sgd_iter}, sgd_minibatch_size={sgd_minibatch_size}, "
                f"sequence_length={sequence_length}): need num_sgd_iter >= 1, sgd_minibatch_size >= 0, "
                "sequence_length >= 1"
            )
        super().__init__(name=name, daemon=True)
        self.local_worker = local_worker
        #: The learner group that learns for this thread, if any.
        self.learners = learners
        self.learn_fn: LearnFn = learn_fn or functools.partial(
            learn_on_local_worker if learners is None else functools.partial(learn_in_group, learners),
            policies=policies,
            num_sgd_iter=num_sgd_iter,
            sgd_minibatch_size=sgd_minibatch_size,
            sequence_length=sequence_length,
        )
        self.inqueue: EventQueue[Batch | FromActor[Batch]] = EventQueue(inqueue_size)
        self.outqueue: EventQueue[Learned] = EventQueue(outqueue_size)
        self.queue_timer = TimerStat()  # seconds waited for each batch
        self.learn_timer = TimerStat()  # seconds per learn_fn call; units: steps trained
        self.num_steps_trained = 0
        self.num_batches_trained = 0
        self._steps_being_delivered = 0  # of the result being put on a full outqueue
        self.learner_info: dict[str, dict[str, float]] = {}
        self.error: BaseException | None = None
        self.error_traceback = ""
        # Held during each learn_fn call: driver-side code that reads the learning policies
        # (weights to broadcast, checkpoints) or changes them (target networks) takes it to
        # stay out of a step. The local worker's own lock, so a checkpoint takes the same one.
        self.lock = getattr(local_worker, "lock", None) or threading.RLock()
        self._stop_event = threading.Event()
        self._waiting_sum = 0
        self.timeout_s = timeout_s if learners is None or timeout_s is None else max(timeout_s, learners.update_limit_s)
        self._learning_since: float | None = None  # when the learn_fn call in progress started

    # -- the thread --------------------------------------------------------------------

    def run(self) -> None:
        try:
            while not self._stop_event.is_set():
                self._step()
        except BaseException as e:  # noqa: BLE001 - carried to the driver by check()
            self.error_traceback = "".join(traceback.format_exception(type(e), e, e.__traceback__))
            self.error = e
            logger.error("learner thread %r failed:\n%s", self.name, self.error_traceback)

    def _step(self) -> None:
        waited_from = time.perf_counter()
        while True:
            try:
                item = self.inqueue.get(timeout=self.poll_interval_s)
                break
            except queue.Empty:
                if self._stop_event.is_set():
                    return
        self.queue_timer.push(time.perf_counter() - waited_from)
        # Batches still waiting: near capacity on average means the learner is the bottleneck.
        self._waiting_sum += self.inqueue.qsize()

        source, batch = (item.actor, item.item) if isinstance(item, FromActor) else (None, item)
        self._learning_since = time.monotonic()
        with self.lock, self.learn_timer:
            result = self.learn_fn(self.local_worker, batch)._replace(source=source)
            self.learn_timer.push_units_processed(result.steps)
            # Counted with the weights they changed: a checkpoint (under the lock) sees both or neither.
            self.num_steps_trained += result.steps
            self.num_batches_trained += 1
            self._steps_being_delivered = result.steps
        self._learning_since = None
        self.learner_info = result.info

        try:
            while not self._stop_event.is_set():
                try:
                    self.outqueue.put(result, timeout=self.poll_interval_s)
                    return
                except queue.Full:
                    continue
        finally:
            self._steps_being_delivered = 0

    def steps_not_delivered(self) -> int:
        """Steps trained whose results the driver has not taken from ``outqueue`` yet."""
        with self.outqueue.mutex:
            queued = sum(getattr(item, "steps", 0) for item in self.outqueue.queue)
        return queued + self._steps_being_delivered

    # -- the driver's side ---------------------------------------------------------------

    def check(self) -> bool:
        """Whether the thread still produces results; meant as ``Dequeue(..., check=)``.

        True while it runs; False once it was stopped; raises
        :class:`~flowrl.errors.LearnerThreadError` (the original exception as
        ``__cause__``) if learning failed, and :class:`~flowrl.errors.FlowRLError` if the
        thread was never started (a plan would otherwise wait for it forever).
        """
        if self.error is not None:
            e = self.error
            raise LearnerThreadError(
                f"learner thread {self.name!r} failed: {type(e).__name__}: {e}\n"
                f"traceback in the learner thread:\n{self.error_traceback}"
            ) from e
        started = self._learning_since
        if self.timeout_s is not None and started is not None and time.monotonic() - started > self.timeout_s:
            raise LearnerThreadError(
                f"learner thread {self.name!r} has been learning on one batch for over {self.timeout_s:g} s "
                "(learner_timeout_s): it is stuck or far too slow"
            )
        if self._stop_event.is_set():
            return False
        if self.ident is None:
            raise FlowRLError(
                f"learner thread {self.name!r} was never started; call start() before reading its outqueue"
            )
        return self.is_alive()

    def stop(self, timeout: float = 5.0) -> bool:
        """Ask the thread to end and wait up to ``timeout`` s for it; True once it has ended.

        Idempotent. The thread finishes the ``learn_fn`` call it is in; batches still on
        the inqueue are left there.
        """
        self._stop_event.set()
        if self.ident is not None and self is not threading.current_thread():
            self.join(timeout)
        return not self.is_alive()

    def stats(self) -> dict[str, Any]:
        """Queue sizes, mean wait and learn times (and their totals so far), steps trained and learn throughput."""
        taken = self.queue_timer.count
        return {
            "inqueue_size": self.inqueue.qsize(),
            "inqueue_capacity": self.inqueue.maxsize,
            "inqueue_size_mean": self._waiting_sum / taken if taken else 0.0,
            "outqueue_size": self.outqueue.qsize(),
            "queue_wait_mean_s": self.queue_timer.mean,
            "learn_time_mean_s": self.learn_timer.mean,
            "queue_wait_total_s": self.queue_timer.total_s,
            "learn_time_total_s": self.learn_timer.total_s,
            "learn_throughput": self.learn_timer.mean_throughput,
            "num_steps_trained": self.num_steps_trained,
            "num_batches_trained": self.num_batches_trained,
            "alive": self.is_alive(),
            "failed": self.error is not None,
        }
