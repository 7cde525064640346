"""The Ape-X replay tier: :class:`~flowrl.actors.ReplayActor` shards, replaced when one fails.

Apart from the actor class, so that a plan built over placeholder actors (``flowrl plan``)
declares its replay tier without importing Ray.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence
from typing import Any, Iterator, Mapping, overload

from flowrl.actors.placeholders import PlaceholderActor, placeholders_active
from flowrl.actors.placement import REPLAY_SHARD, Reservation
from flowrl.actors.restart_budget import RestartBudget
from flowrl.deferred import ray
from flowrl.errors import FlowRLError, ReplayShardError

logger = logging.getLogger(__name__)


def _first_line(error: BaseException | None) -> str:
    """``Type: first line of its message``: Ray's error texts run to many lines."""
    if error is None:
        return "reported failed"
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


#: Where replay shards may be placed on a cluster (see :class:`ReplayShards`).
REPLAY_PLACEMENTS = ("driver_node", "spread")

#: Longest :meth:`ReplayShards.replace` waits before recreating a shard whose replacements keep failing to
#: start (a shorter cap than the restart backoff's: its callers wait for it, see there).
MAX_SHARD_RESTART_WAIT_S = 4.0


class ReplayShards(Sequence[Any]):
    """The replay tier: :class:`ReplayActor` handles that a dead shard's replacement takes the place of.

    Reads like the list of the current handles (``len``, indexing, iteration), so code that
    reads it at the time of use always sees the live shards. Remembers each shard's buffer
    arguments: :meth:`replace` recreates a failed shard *empty* with them (its rows are lost;
    it replays again once it holds ``learning_starts`` steps), in the same position, logs a
    warning and counts the restart in ``num_restarts``; ``refill_steps`` sums the
    ``learning_starts`` of the shards that started empty after the run began (replaced, or restored
    without rows: steps sampling must add before they replay), and
    ``num_lost_calls`` counts the writes and priority updates the replay operators lost to a
    shard that died. ``restart_budget`` caps the restarts (none by default; a plan's shards get
    ``max_worker_restarts`` within ``restart_window_s``): past it, :meth:`replace` raises
    :class:`~flowrl.errors.WorkerFailureError`; a shard whose replacements keep failing to start
    is recreated after a growing delay of at most :data:`MAX_SHARD_RESTART_WAIT_S`. Build one with
    :func:`create_replay_actors`.

    ``placement`` says where on a cluster the shards (and their replacements) run:
    ``"driver_node"`` on the node of this driver, next to the learner that stores to and
    replays from them; ``"spread"`` over the nodes. Shards that ask for CPUs run in the
    bundles ``reservation`` holds for them (the run's placement group, whose
    ``replay_shard`` bundles are pinned to the driver's node for ``"driver_node"`` and laid
    out by its strategy for ``"spread"``).
    """

    def __init__(
        self,
        shard_args: Sequence[Mapping[str, Any]],
        *,
        num_cpus: float = 0.0,
        placement: str = "driver_node",
        reservation: Reservation | None = None,
        restart_budget: RestartBudget | None = None,
    ) -> None:
        if not shard_args:
            raise FlowRLError("ReplayShards needs the buffer arguments of at least one shard")
        if placement not in REPLAY_PLACEMENTS:
            raise FlowRLError(f"ReplayShards(placement={placement!r}): must be one of {REPLAY_PLACEMENTS}")
        self._shard_args = [dict(args) for args in shard_args]
        self._num_cpus = num_cpus
        self._placement = placement
        self._reservation = reservation
        self._actors = [self._start(args, i) for i, args in enumerate(self._shard_args)]
        # Failed handles -> their position, so that every later report of one gets its replacement.
        self._replaced: dict[Any, int] = {}
        # Gathers, operators and PlanResources.stats may report the same failure from different threads.
        self._lock = threading.Lock()
        self._stopped = False
        self.restart_budget = restart_budget or RestartBudget("replay shard", None, math.inf)
        self.num_restarts = 0
        self.refill_steps = 0
        self.num_lost_calls = 0

    def _start(self, args: Mapping[str, Any], position: int, replacement: bool = False) -> Any:
        if placeholders_active():
            return PlaceholderActor("ReplayActor")
        from flowrl.actors.replay_actor import ReplayActor  # the Ray actor class: imports Ray

        # ray.remote's stubs keep the class type, which has no .options.
        actor_class: Any = ReplayActor
        if self._reservation is not None and self._reservation.reserved(
            REPLAY_SHARD
        ):  # in its bundle, wherever that is
            return actor_class.options(
                num_cpus=self._num_cpus, **self._reservation.options(REPLAY_SHARD, position)
            ).remote(**args)
        # Ray's SPREAD and soft node affinity are best effort: they put shards on the nodes with free
        # CPUs, e.g. two on one node, or one off the driver's node. A shard that asks for no CPUs fits on
        # any node, so it gets a hard affinity; one that asks for CPUs may go elsewhere rather than wait.
        if self._placement == "spread":  # shard i on the i-th live node
            nodes = sorted(node["NodeID"] for node in ray.nodes() if node.get("Alive"))
            node = nodes[position % len(nodes)]
        else:  # the driver's node, which lives as long as the run
            node = ray.get_runtime_context().get_node_id()
        # A replacement's target may be the node just lost (still listed as alive): it may go elsewhere.
        strategy = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
            node, soft=self._num_cpus > 0 or replacement
        )
        return actor_class.options(num_cpus=self._num_cpus, scheduling_strategy=strategy).remote(**args)

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...

    def __getitem__(self, index: int | slice) -> Any:
        return self._actors[index]

    def __len__(self) -> int:
        return len(self._actors)

    def __iter__(self) -> Iterator[Any]:
        # A copy: a replacement during the iteration does not disturb it.
        return iter(list(self._actors))

    def __repr__(self) -> str:
        return f"ReplayShards({len(self._actors)} shards, {self.num_restarts} restarts)"

    def was_replaced(self, actor: Any) -> bool:
        """Whether ``actor`` is a shard that failed and was replaced (rows it handed out are gone)."""
        return actor in self._replaced

    def replace(self, failed_actor: Any, error: BaseException | None = None) -> Any:
        """The replacement of ``failed_actor``: a new, empty shard with the same arguments, in its place.

        Idempotent: a shard that was already replaced is not replaced again, and every
        caller reporting it gets the shard now in its place. The failed actor is killed, in
        case it is hung rather than dead. Raises :class:`~flowrl.errors.ReplayShardError`
        for an actor that is not one of these shards, or after :meth:`stop`, and
        :class:`~flowrl.errors.WorkerFailureError` past the restart budget.

        Unlike a rollout worker's, a shard's replacement is made here, after the restart backoff
        if its predecessor failed to start: every position must hold a shard at every moment (a
        store picks any shard, the stats and a checkpoint ask each one, and the position is the
        shard's identity in checkpoints and ``refill_steps``), so there is nothing to serve in its
        place meanwhile. That wait is at most :data:`MAX_SHARD_RESTART_WAIT_S` and holds only this
        tier's lock: no caller holds the local worker's lock, so a learner thread goes on training
        on the batches it has queued.
        """
        with self._lock:
            if failed_actor in self._replaced:
                return self._actors[self._replaced[failed_actor]]
            if self._stopped:
                raise ReplayShardError(
                    f"replay shard {failed_actor} failed after the replay tier was stopped"
                ) from error
            try:
                index = self._actors.index(failed_actor)
            except ValueError:
                raise ReplayShardError(
                    f"{failed_actor} failed but is not one of the replay shards {self._actors}"
                ) from error
            ray.kill(failed_actor)
            cause = error if error is not None else ReplayShardError(f"replay shard {index} was reported failed")
            self.restart_budget.spend(f"replay shard {index} failed ({_first_line(error)})", cause)
            delay = min(self.restart_budget.backoff(index, cause), MAX_SHARD_RESTART_WAIT_S)
            logger.warning(
                "replay shard %d failed (%s); recreating it empty%s (replay shard restart %d)",
                index,
                _first_line(error),
                f" in {delay:g} s" if delay else "",
                self.num_restarts + 1,
            )
            time.sleep(delay)  # every caller waits (bounded, see above): none may use the shard before it exists
            self._actors[index] = self._start(self._shard_args[index], index, replacement=True)
            self._replaced[failed_actor] = index
            self.num_restarts += 1
            self.starts_empty(index)
            return self._actors[index]

    def starts_empty(self, index: int) -> None:
        """Shard ``index`` holds no rows (recreated, or restored from a checkpoint without its rows):
        its ``learning_starts`` joins ``refill_steps``, the steps sampling must add before it replays."""
        self.refill_steps += int(self._shard_args[index].get("learning_starts", 0))

    def stop(self) -> None:
        """Kill every shard; failures reported afterwards raise instead of starting new ones (idempotent)."""
        with self._lock:
            self._stopped = True
            for actor in self._actors:
                ray.kill(actor)


def create_replay_actors(
    num_shards: int,
    *,
    capacity: int,
    learning_starts: int,
    num_cpus: float = 0.0,
    seed: int | None = None,
    placement: str = "driver_node",
    reservation: Reservation | None = None,
    time_handoffs: bool = True,
    restart_budget: RestartBudget | None = None,
    **buffer_args: Any,
) -> ReplayShards:
    """``num_shards`` :class:`ReplayActor` shards splitting ``capacity`` and ``learning_starts`` between them.

    ``buffer_args``: the other arguments of :class:`~flowrl.data.LocalReplayBuffer`; shard
    ``i`` samples with ``seed + i``; ``time_handoffs``: the shards time Ray's serialization of
    their replayed batches for the X-ray. The shards come as :class:`ReplayShards` (placed by
    ``placement``, in ``reservation``'s bundles if it holds some), which recreates a failed one
    within ``restart_budget``.
    """
    if num_shards < 1:
        raise FlowRLError(f"create_replay_actors(num_shards={num_shards}): needs at least one shard")
    shard_args = [
        {
            "capacity": max(1, capacity // num_shards),
            "learning_starts": learning_starts // num_shards,
            "seed": None if seed is None else seed + shard,
            "time_handoffs": time_handoffs,
            **buffer_args,
        }
        for shard in range(num_shards)
    ]
    return ReplayShards(
        shard_args, num_cpus=num_cpus, placement=placement, reservation=reservation, restart_budget=restart_budget
    )
