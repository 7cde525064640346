"""Operators for experience replay: storing rollouts, replaying batches, updating priorities.

Calls to replay shard actors are checked, not fired and forgotten: the operators keep each
call until it finished, look at the finished ones on every call (without blocking), and
block (for at most ``timeout_s``) while ``max_in_flight`` are pending, so an error in a shard
reaches the driver on the next call and unacknowledged batches never pile up. Given the
shards as :class:`~flowrl.actors.ReplayShards`, a dead shard is recreated empty and the
plan goes on; given any other sequence, it is a :class:`~flowrl.errors.ReplayShardError`.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any, Iterator, Mapping, NamedTuple, Sequence

import numpy as np

from flowrl.actors import Learned, ReplayShards
from flowrl.data import (
    MultiAgentBatch,
    SampleBatch,
)
from flowrl.data.protocols import ReplayBufferLike
from flowrl.deferred import ray
from flowrl.errors import FlowRLError, ReplayShardError, ShardFailedError
from flowrl.iterators import (
    LocalIterator,
    NextValueNotReady,
    SharedMetrics,
    from_actors,
)
from flowrl.iterators.local import StreamTransform
from flowrl.iterators.metrics import BLOCKED, HELD, account
from flowrl.operators.names import (
    STEPS_SAMPLED_COUNTER,
    STEPS_TRAINED_COUNTER,
)
from flowrl.operators.protocol import ActorLink, HiddenOperator, Operator, StatefulOperator
from flowrl.operators.train_ops import Trained

Batch = SampleBatch | MultiAgentBatch

logger = logging.getLogger(__name__)

#: Default bound on a replay operator's unanswered calls, per replay shard.
CALLS_IN_FLIGHT_PER_SHARD = 4
#: Longest a replay operator waits for room under its bound before the shards count as hung.
SHARD_CALL_TIMEOUT_S = 60.0
#: Longest a replay shard may take to answer a replay request before it counts as failed.
REPLAY_TIMEOUT_S = 60.0


class _ShardCall(NamedTuple):
    """A call to a replay shard whose answer is awaited only to see that it succeeded."""

    ref: ray.ObjectRef[Any]
    actor: Any
    shard_index: int | None


class _ShardCalls:
    """One operator's unanswered calls to replay shards: bounded, and checked for errors.

    A call whose shard died counts in ``num_lost`` (its shard replaced, when the shards are
    :class:`~flowrl.actors.ReplayShards`); one that raised in the shard raises
    :class:`~flowrl.errors.ReplayShardError` here.
    """

    def __init__(self, shards: Sequence[Any] | None, what: str, max_in_flight: int | None, timeout_s: float) -> None:
        if max_in_flight is None:
            max_in_flight = CALLS_IN_FLIGHT_PER_SHARD * max(1, len(shards or ()))
        if max_in_flight < 1:
            raise FlowRLError(f"max_in_flight={max_in_flight}: at least one call to the replay shards must be allowed")
        if timeout_s <= 0:
            raise FlowRLError(f"timeout_s={timeout_s}: must be > 0 seconds")
        self.shards = shards
        self.what = what
        self.max_in_flight = max_in_flight
        self.timeout_s = timeout_s
        self.pending: list[_ShardCall] = []
        self.num_lost = 0

    def add(self, ref: ray.ObjectRef[Any], actor: Any, shard_index: int | None) -> None:
        """Keep the call ``ref`` made to ``actor`` until it finished."""
        self.pending.append(_ShardCall(ref, actor, shard_index))

    def make_room(self) -> None:
        """Check the finished calls, then block until fewer than ``max_in_flight`` are pending."""
        self.check_finished()
        deadline = time.monotonic() + self.timeout_s
        while len(self.pending) >= self.max_in_flight:
            left = deadline - time.monotonic()
            if left <= 0:
                shards = sorted({_shard_name(call.shard_index, call.actor) for call in self.pending})
                raise ReplayShardError(
                    f"{len(self.pending)} calls to {self.what} on {', '.join(shards)} got no answer within "
                    f"{self.timeout_s} s (max_in_flight={self.max_in_flight}): the shards are hung or overloaded"
                )
            refs = [call.ref for call in self.pending]
            started = time.perf_counter()
            ray.wait(refs, num_returns=len(refs) - self.max_in_flight + 1, timeout=left)
            account(BLOCKED, time.perf_counter() - started)  # the shards' back-pressure
            self.check_finished()

    def check_finished(self) -> None:
        """Settle every call that finished, without waiting for the others."""
        if not self.pending:
            return
        done, _ = ray.wait([call.ref for call in self.pending], num_returns=len(self.pending), timeout=0)
        finished = set(done)
        for call in [call for call in self.pending if call.ref in finished]:
            self.pending.remove(call)
            self._settle(call)

    def _settle(self, call: _ShardCall) -> None:
        name = _shard_name(call.shard_index, call.actor)
        try:
            ray.get(call.ref, timeout=0)  # finished: answers at once
        except ray.exceptions.RayActorError as e:
            if not isinstance(self.shards, ReplayShards):
                raise ReplayShardError(f"{name} died before it could {self.what}") from e
            self.shards.replace(call.actor, e)
            self.shards.num_lost_calls += 1  # for the result (PlanResources.fault_counters)
            self.num_lost += 1
            logger.debug("%s died before it could %s; the call is lost", name, self.what)
        except ray.exceptions.RayError as e:
            cause = e.cause if isinstance(e, ray.exceptions.RayTaskError) else e
            raise ReplayShardError(f"{name} failed to {self.what}: {type(cause).__name__}: {cause}") from e


def _shard_name(shard_index: int | None, actor: Any) -> str:
    return f"replay shard {shard_index}" if shard_index is not None else f"replay shard {actor}"


def _index_of(shards: Sequence[Any], actor: Any) -> int | None:
    try:
        return shards.index(actor)
    except ValueError:
        return None


class _ShardWriter(Operator):
    """An operator that writes to a local replay buffer or, through bounded calls, to replay shards
    (``_needs_one_target``: exactly one of the two)."""

    _call_name = ""
    _needs_one_target = False

    def __init__(
        self,
        local_buffer: ReplayBufferLike | None = None,
        *,
        actors: Sequence[Any] | None = None,
        max_in_flight: int | None = None,
        timeout_s: float = SHARD_CALL_TIMEOUT_S,
    ) -> None:
        if self._needs_one_target and (local_buffer is None) == (actors is None):
            raise FlowRLError(f"{type(self).__name__} needs exactly one of local_buffer= or actors=")
        self.local_buffer = local_buffer
        # Not copied: a replaced shard must be seen in place of the dead one.
        self.actors: Sequence[Any] | None = actors
        self._calls = _ShardCalls(actors, self._call_name, max_in_flight, timeout_s)


class StoreToReplayBuffer(_ShardWriter):
    """Add each batch to a local replay buffer, or to a random one of the replay actors (pass-through).

    The buffers are owned outside the plan (:class:`~flowrl.actors.PlanResources`), which
    also checkpoints them. With actors, at most ``max_in_flight`` writes (default
    :data:`CALLS_IN_FLIGHT_PER_SHARD` per shard) are unanswered at any time: a store call
    blocks until there is room, for at most ``timeout_s``, then raises
    :class:`~flowrl.errors.ReplayShardError`. A shard's error in ``add_batch`` raises that
    error on a later store call; a write to a shard that died is lost (``num_lost_replay_writes``)
    and the shard recreated when ``actors`` are :class:`~flowrl.actors.ReplayShards`.
    """

    _call_name = "store a batch"
    _needs_one_target = True

    @property
    def pending_writes(self) -> int:
        """Writes sent to the replay shards and not yet seen to finish."""
        return len(self._calls.pending)

    @property
    def num_lost_replay_writes(self) -> int:
        """Writes that never reached a buffer because their shard died."""
        return self._calls.num_lost

    def plan_links(self) -> list[ActorLink]:
        """Adds batches to the replay shards (nothing for a local buffer)."""
        return [ActorLink("ReplayActor", "add batch")] if self.actors else []

    def __call__(self, batch: Batch) -> Batch:
        if self.local_buffer is not None:
            self.local_buffer.add_batch(batch)
            return batch
        self._calls.make_room()
        actors = self.actors or ()
        index = random.randrange(len(actors))
        actor = actors[index]
        self._calls.add(actor.add_batch.remote(batch), actor, index)
        return batch


class _IsBatch(HiddenOperator):
    """Drops the None a replay shard answers before it holds ``learning_starts`` steps."""

    def __call__(self, item: Any) -> bool:
        return item is not None


class _ReplaceFailedShard:
    """The failure hook of a gather over :class:`~flowrl.actors.ReplayShards`: a shard that died
    or hung is recreated empty; one whose code raised is an error (a new shard would raise again)."""

    def __init__(self, shards: ReplayShards) -> None:
        self.shards = shards

    def __call__(self, shard_index: int, failed_actor: Any, error: ShardFailedError) -> Any:
        if error.reason == "raised":
            cause = error.__cause__
            cause = cause.cause if isinstance(cause, ray.exceptions.RayTaskError) else cause
            raise ReplayShardError(
                f"replay shard {shard_index} failed to replay: {type(cause).__name__}: {cause}"
            ) from error
        return self.shards.replace(failed_actor, error)


def Replay(
    *,
    local_buffer: ReplayBufferLike | None = None,
    actors: Sequence[Any] | None = None,
    num_async: int = 4,
    timeout_s: float = REPLAY_TIMEOUT_S,
) -> LocalIterator[Batch]:
    """A source of replayed batches, from a local buffer or from replay actors.

    Until a buffer holds ``learning_starts`` steps it has nothing to give: inside a union a
    local buffer yields a not-ready marker so the other sub-flows (the one filling the
    buffer) run, and replay actors answer None after a short wait, which is dropped here.
    With actors, batches arrive as shards produce them (``num_async`` requests in flight
    per shard); :meth:`~flowrl.iterators.LocalIterator.zip_with_source_actor` names the shard.
    A shard that dies, or gives no answer within ``timeout_s``, is recreated empty when
    ``actors`` are :class:`~flowrl.actors.ReplayShards` and the gather goes on; otherwise
    it raises :class:`~flowrl.errors.ShardFailedError`.
    """
    if (local_buffer is None) == (actors is None):
        raise FlowRLError("Replay needs exactly one of local_buffer= or actors=")
    if actors is not None:
        hook = _ReplaceFailedShard(actors) if isinstance(actors, ReplayShards) else None
        shards = from_actors(actors, name="replay_actors", on_shard_failure=hook, shard_timeout_s=timeout_s)
        return shards.gather_async(num_async=num_async).filter(_IsBatch())

    def base(timeout: float | None) -> Iterator[Any]:
        while True:
            batch = local_buffer.replay()  # type: ignore[union-attr]
            if batch is None:
                if timeout is None:
                    raise FlowRLError(
                        "Replay: the buffer has fewer than learning_starts steps and nothing else fills it "
                        "here; run Replay inside Concurrently with the flow that stores experience"
                    )
                yield NextValueNotReady(waits_on_siblings=True)
            else:
                yield batch

    return LocalIterator(base, SharedMetrics(), name="replay")


class MixInReplay(StatefulOperator):
    """Mix replayed batches into a stream of fresh ones; use with ``combine``.

    Keeps the last ``num_slots`` input batches. Each input comes out first, followed on
    average by ``replay_proportion`` batches drawn uniformly from the slots (the whole
    part always, the fractional part by chance), so the train batches it feeds are
    ``replay_proportion / (1 + replay_proportion)`` replay. Off-policy learners (IMPALA's
    V-trace) correct for the older behaviour policy of the replayed batches.
    """

    state_key = "mix_in_replay"

    def __init__(self, num_slots: int, replay_proportion: float, seed: int | None = None) -> None:
        if num_slots < 1:
            raise FlowRLError(f"MixInReplay(num_slots={num_slots}): must be >= 1")
        if replay_proportion < 0:
            raise FlowRLError(f"MixInReplay(replay_proportion={replay_proportion}): must be >= 0")
        self.num_slots = num_slots
        self.replay_proportion = replay_proportion
        self.slots: list[Batch] = []
        self.next_slot = 0
        self.rng = np.random.default_rng(seed)

    def get_state(self) -> dict[str, Any]:
        """The sampling RNG, for checkpoints (the slots are not saved: they refill within ``num_slots`` batches)."""
        return {"rng": self.rng.bit_generator.state}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`get_state`'s output."""
        self.rng.bit_generator.state = state["rng"]

    def __call__(self, batch: Batch) -> list[Batch]:
        whole = int(self.replay_proportion)
        num_replays = whole + int(self.rng.random() < self.replay_proportion - whole)
        replayed = [self.slots[i] for i in self.rng.integers(len(self.slots), size=num_replays)] if self.slots else []
        if len(self.slots) < self.num_slots:
            self.slots.append(batch)
        else:
            self.slots[self.next_slot] = batch
            self.next_slot = (self.next_slot + 1) % self.num_slots
        return [batch, *replayed]


class UpdatePriorities(_ShardWriter):
    """Set the replayed rows' new priorities where they were replayed from (pass-through).

    Consumes :class:`~flowrl.operators.train_ops.Trained` (TrainOneStep's, replayed from
    ``local_buffer``; its priorities travel in ``info.priorities``) or
    :class:`~flowrl.actors.Learned` (a learner thread's, replayed from the replay shard that
    is its ``source``) and hands their ``priorities`` (replayed rows' indexes and TD errors)
    to that buffer.

    Updates sent to shards are bounded and checked as :class:`StoreToReplayBuffer`'s
    writes are (``max_in_flight``: default :data:`CALLS_IN_FLIGHT_PER_SHARD` per shard of
    ``actors``, or that many without them): a shard's error (such as a non-finite priority)
    raises :class:`~flowrl.errors.ReplayShardError` on a later call. Priorities for a shard
    that has died are dropped, counted in ``num_dropped_priority_updates``: its replacement
    holds none of those rows. Pass the shards as ``actors``
    (:class:`~flowrl.actors.ReplayShards`) to have a dead one recreated; without them a
    dead shard is an error.
    """

    _call_name = "update priorities"
    _num_dropped_stale = 0

    @property
    def pending_updates(self) -> int:
        """Priority updates sent to the replay shards and not yet seen to finish."""
        return len(self._calls.pending)

    @property
    def num_dropped_priority_updates(self) -> int:
        """Priority updates dropped because their shard had died."""
        return self._calls.num_lost + self._num_dropped_stale

    def plan_links(self) -> list[ActorLink]:
        """Sends priorities back to the replay shards (nothing for a local buffer)."""
        return [] if self.local_buffer is not None else [ActorLink("ReplayActor", "update priorities")]

    def __call__(self, item: Trained | Learned) -> Trained | Learned:
        if not item.priorities:
            return item
        if self.local_buffer is not None:
            self.local_buffer.update_priorities(item.priorities)
        elif isinstance(item, Learned) and item.source is not None:
            self._send(item.source, dict(item.priorities))
        else:
            raise FlowRLError(
                "UpdatePriorities without local_buffer= needs Learned items whose source is a replay shard"
            )
        return item

    def _send(self, shard: Any, priorities: dict[str, Any]) -> None:
        self._calls.make_room()
        if isinstance(self.actors, ReplayShards) and self.actors.was_replaced(shard):
            self._num_dropped_stale += 1
            self.actors.num_lost_calls += 1
            logger.debug("dropped priorities for replay shard %s: it died and was replaced", shard)
            return
        index = _index_of(self.actors, shard) if self.actors is not None else None
        self._calls.add(shard.update_priorities.remote(priorities), shard, index)


class ThrottleSampling(StreamTransform):
    """Hold back sampling so that training keeps up: a stream transform for the sampling sub-flow.

    Once ``start_after`` steps were sampled, the next batch is pulled only while
    ``steps_sampled <= start_after + steps_trained / training_intensity``; otherwise it
    yields a not-ready marker, so an async union serves the learner's sub-flows until they
    have trained enough. Keeps the replay ratio of asynchronous plans (Ape-X) close to
    ``training_intensity`` whatever the relative speed of sampling and learning.

    With ``replay_shards`` (:class:`~flowrl.actors.ReplayShards`; other sequences never
    recreate a shard), each shard recreated after a failure adds its ``learning_starts``
    to ``start_after``: it replays nothing until sampling refilled it, and with a single
    shard training would otherwise wait on sampling and sampling on training for ever.
    """

    def __init__(
        self, training_intensity: float, start_after: int, *, replay_shards: Sequence[Any] | None = None
    ) -> None:
        if training_intensity <= 0:
            raise FlowRLError(f"ThrottleSampling(training_intensity={training_intensity}): must be > 0")
        self.training_intensity = training_intensity
        self.start_after = start_after
        self.replay_shards = replay_shards

    def __call__(self, upstream: Iterator[Any]) -> Iterator[Any]:
        held_since: float | None = None
        while True:
            counters = LocalIterator.get_metrics().counters
            refill = self.replay_shards.refill_steps if isinstance(self.replay_shards, ReplayShards) else 0
            allowed = self.start_after + refill + counters[STEPS_TRAINED_COUNTER] / self.training_intensity
            if counters[STEPS_SAMPLED_COUNTER] > allowed:
                held_since = held_since or time.perf_counter()
                yield NextValueNotReady(waits_on_siblings=True)
                continue
            if held_since is not None:  # sampling was held back for training to catch up: back-pressure
                account(HELD, time.perf_counter() - held_since)
                held_since = None
            try:
                item = next(upstream)
            except StopIteration:
                return
            yield item
