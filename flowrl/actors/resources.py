"""The long-lived, stateful pieces of a plan beside its rollout workers, owned by the Trainer.

Replay buffers (local, or shards as :class:`~flowrl.actors.ReplayActor`\\ s), a
:class:`~flowrl.actors.LearnerThread` and aggregator actors outlive any one iteration and
hold state a checkpoint must keep. An algorithm *declares* them (its ``make_resources``);
the Trainer creates them before the plan and hands them to ``execution_plan``, which only
wires iterators over them; :meth:`PlanResources.stop` releases them and
:meth:`PlanResources.get_state` is what checkpoints read. Because the plan does not own
them, one can be replaced without rebuilding the plan.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Protocol, runtime_checkable

from flowrl.actors.aggregator import AggregatorSet
from flowrl.actors.learner_group import LearnerGroup, learner_group
from flowrl.actors.learner_thread import LearnerThread
from flowrl.actors.placeholders import placeholders_active
from flowrl.actors.placement import Reservation
from flowrl.actors.replay_shards import ReplayShards, create_replay_actors
from flowrl.actors.restart_budget import RestartBudget
from flowrl.data import LocalReplayBuffer
from flowrl.deferred import ray
from flowrl.errors import CheckpointError, FlowRLError, ReplayShardError
from flowrl.storage.array_files import ArrayFileReader, ArrayFileWriter

if TYPE_CHECKING:
    from flowrl.actors.worker_set import WorkerSet
    from flowrl.config import TrainerConfig
    from flowrl.data.offline import OfflineData

#: Longest wait for a replay shard's statistics, and for its state in a checkpoint.
STATS_TIMEOUT_S = 10.0
STATE_TIMEOUT_S = 300.0
#: The slowest storage a save or restore of replay shards' rows waits for: their wait grows by 1 s per this many bytes.
SLOWEST_REPLAY_BYTES_PER_S = 20e6

logger = logging.getLogger(__name__)


class ReplayConfig(Protocol):
    """The replay keys of a config (DQN's and the algorithms built on its replay), and the restart budget
    its replay shards share with every other kind of actor."""

    buffer_size: int
    learning_starts: int
    train_batch_size: int
    prioritized_replay: bool
    prioritized_replay_alpha: float
    prioritized_replay_beta: float
    prioritized_replay_eps: float
    seed: int | None
    profile: bool
    max_worker_restarts: int
    restart_window_s: float


@runtime_checkable
class SequenceReplayConfig(Protocol):
    """A config whose replay stores sequences (R2D2's)."""

    replay_sequence_length: int


def replay_buffer_args(config: ReplayConfig) -> dict[str, Any]:
    """The replay settings of a config as keyword arguments of a replay buffer (or a tier of shards);
    a config that replays sequences of ``replay_sequence_length`` steps replays ``train_batch_size``
    steps as that many whole sequences."""
    length = config.replay_sequence_length if isinstance(config, SequenceReplayConfig) else 1
    return {
        "capacity": config.buffer_size,
        "learning_starts": config.learning_starts,
        "replay_batch_size": max(1, config.train_batch_size // length),
        "prioritized_replay_alpha": config.prioritized_replay_alpha,
        "prioritized_replay_beta": config.prioritized_replay_beta,
        "prioritized_replay_eps": config.prioritized_replay_eps,
        "prioritized": config.prioritized_replay,
        "seed": config.seed,
        "replay_sequence_length": length,
    }


@dataclass
class PlanResources:
    """What a plan wires besides its rollout workers; empty for plans that need none.

    ``replay_buffer``: a local replay buffer (DQN). ``replay_actors``: replay shard actors
    (Ape-X), as :class:`~flowrl.actors.ReplayShards` so that a dead one is recreated (in
    any other sequence a dead shard is an error). ``learner``: a learner thread (Ape-X,
    IMPALA, APPO), started here if it was not (unless the plan is built over placeholder
    actors). ``aggregators``: aggregator actors (IMPALA's tree aggregation). ``learners``: a
    learner group training the policies data-parallel (``num_learners >= 2``), which
    ``TrainOneStep`` or the learner thread drives. With ``checkpoint_replay_contents`` the
    replay contents go into checkpoints, not only their counters.

    Operators that use these pieces take the resources and read them here (``TrainOneStep``
    learns in ``learners``; ``UpdateTargetNetwork`` also holds ``learner.lock``), so a plan
    passes no learner group or lock by itself.
    """

    replay_buffer: LocalReplayBuffer | None = None
    replay_actors: Sequence[Any] = field(default_factory=list)
    learner: LearnerThread | None = None
    aggregators: AggregatorSet | None = None
    learners: LearnerGroup | None = None
    checkpoint_replay_contents: bool = False
    #: The run's offline experiences (``input``), opened and checked (:mod:`flowrl.actors.offline_input`).
    offline: OfflineData | None = None

    def __post_init__(self) -> None:
        # A plan built over placeholder actors, for its graph, learns nothing: its thread never starts.
        if self.learner is not None and self.learner.ident is None and not placeholders_active():
            self.learner.start()

    def need_replay_buffer(self) -> LocalReplayBuffer:
        """The local replay buffer; a plan that needs one raises a clear error without it."""
        if self.replay_buffer is None:
            raise FlowRLError(
                "this plan replays from a local buffer: declare PlanResources(replay_buffer=...) in make_resources"
            )
        return self.replay_buffer

    def need_offline(self) -> OfflineData:
        """The offline experiences; a plan that reads them raises a clear error without them."""
        if self.offline is None:
            raise FlowRLError(
                "this plan reads offline experiences: declare PlanResources(offline=...) in make_resources"
            )
        return self.offline

    def need_learner(self) -> LearnerThread:
        """The learner thread; a plan that needs one raises a clear error without it."""
        if self.learner is None:
            raise FlowRLError(
                "this plan trains in a learner thread: declare PlanResources(learner=...) in make_resources"
            )
        return self.learner

    def need_replay_actors(self) -> Sequence[Any]:
        """The replay shard actors; a plan that needs them raises a clear error without them."""
        if not self.replay_actors:
            raise FlowRLError(
                "this plan replays from shard actors: declare PlanResources(replay_actors=...) in make_resources"
            )
        return self.replay_actors

    def stop(self) -> None:
        """Stop the learner thread and kill the actors (idempotent)."""
        if self.learner is not None:
            self.learner.stop()
        if isinstance(self.replay_actors, ReplayShards):
            self.replay_actors.stop()  # also keeps a late failure report from starting a new shard
        else:
            for actor in self.replay_actors:
                ray.kill(actor)
        if self.aggregators is not None:
            self.aggregators.stop()
        if self.learners is not None:
            self.learners.stop()
        self.replay_actors, self.aggregators, self.learners = [], None, None

    def fault_counters(self) -> dict[str, int]:
        """Fault counts for the top level of the result (0 for resources a plan does not have):
        ``num_replay_shard_restarts``, ``num_lost_replay_calls`` (writes and priority updates lost
        with a dead shard), ``num_aggregator_restarts`` and ``num_learner_restarts`` (learner groups
        rebuilt after one of their actors failed)."""
        shards = self.replay_actors if isinstance(self.replay_actors, ReplayShards) else None
        return {
            "num_replay_shard_restarts": shards.num_restarts if shards is not None else 0,
            "num_lost_replay_calls": shards.num_lost_calls if shards is not None else 0,
            "num_aggregator_restarts": self.aggregators.num_restarts if self.aggregators is not None else 0,
            "num_learner_restarts": self.learners.num_restarts if self.learners is not None else 0,
        }

    def get_state(self, *, replay: bool = True) -> dict[str, Any]:
        """The replay buffers' state (their contents with ``checkpoint_replay_contents``; nothing of them
        with ``replay=False``, which asks no actor), the fault counters and the restarts that count
        against the replay shards' and aggregators' caps, for checkpoints.

        Learner threads and aggregators keep nothing that outlives a batch: the learner's
        policies are the local worker's, saved with it.
        """
        state: dict[str, Any] = {"fault_counters": self.fault_counters(), "restart_times": self._restart_times()}
        if isinstance(self.replay_actors, ReplayShards):
            state["replay_refill_steps"] = self.replay_actors.refill_steps
        contents = self.checkpoint_replay_contents
        if not replay:
            return state
        if self.replay_buffer is not None:
            state["replay_buffer"] = self.replay_buffer.get_state(include_contents=contents)
        if self.replay_actors:
            args = [(contents,)] * len(self.replay_actors)
            state["replay_shards"] = self._ask_shards(
                "get_state", args, STATE_TIMEOUT_S, skip_dead=self._shards_capped()
            )
        return state

    def write_replay(self, state: Mapping[str, Any], directory: Path) -> tuple[dict[str, Any], dict[str, Any]]:
        """``state`` (:meth:`get_state` with ``replay=False``) with the replay buffers' state added, their rows
        (with ``checkpoint_replay_contents``) written into ``directory``, a checkpoint being staged; and the
        marker entries of the files written (``replay_buffer.<n>.npy``, ``replay_shard_<i>.<n>.npy``).

        The rows go to the files a chunk at a time, straight from the buffers' columns: the local buffer's
        from this process, each shard's from its own process (see :meth:`ReplayActor.write_state`). A shard
        that gives no answer in time (300 s, plus 1 s per 20 MB of the shards' rows) or dies raises
        :class:`~flowrl.errors.ReplayShardError`. :func:`~flowrl.storage.checkpoints.write_checkpoint`'s
        ``streams`` take this method.
        """
        contents = self.checkpoint_replay_contents
        replay: dict[str, Any] = {}
        entries: dict[str, Any] = {}
        if self.replay_buffer is not None:
            writer = ArrayFileWriter(directory, "replay_buffer")
            replay["replay_buffer"] = self.replay_buffer.get_state(
                include_contents=contents, write_column=writer if contents else None
            )
            entries.update(writer.entries)
        if self.replay_actors:
            args = [(str(directory), f"replay_shard_{i}", contents) for i in range(len(self.replay_actors))]
            nbytes = self._shard_bytes() if contents else 0
            timeout_s = STATE_TIMEOUT_S + nbytes / SLOWEST_REPLAY_BYTES_PER_S
            answers = self._ask_shards("write_state", args, timeout_s, skip_dead=self._shards_capped())
            replay["replay_shards"] = [None if answer is None else answer[0] for answer in answers]
            for answer in answers:
                entries.update({} if answer is None else answer[1])
        return {**state, **replay}, entries

    def _shard_bytes(self) -> int:
        args = [()] * len(self.replay_actors)
        stats = self._ask_shards("stats", args, STATS_TIMEOUT_S, skip_dead=self._shards_capped())
        return sum(
            int(buffer["est_size_bytes"])
            for shard in stats
            if shard is not None
            for buffer in shard["policies"].values()
        )

    def _shards_capped(self) -> bool:
        """Whether the replay shards reached their restart cap: a save then leaves a dead shard's rows out
        (the emergency checkpoint of the error that ends the run) instead of failing on it."""
        return isinstance(self.replay_actors, ReplayShards) and self.replay_actors.restart_budget.exhausted

    def set_state(
        self, state: Mapping[str, Any], *, allow_partial: bool = False, directory: Path | None = None
    ) -> None:
        """Restore :meth:`get_state`'s (or :meth:`write_replay`'s) output into resources of the same shape.

        Replay shards of another number are an error, or with ``allow_partial`` left empty. Rows that
        :meth:`write_replay` wrote to files are read back from ``directory``, the checkpoint's, a chunk at a
        time into the new buffers (each shard reads its own files).
        """
        counters = state.get("fault_counters", {})  # absent in checkpoints written before they were saved
        if isinstance(self.replay_actors, ReplayShards):
            self.replay_actors.num_restarts = int(counters.get("num_replay_shard_restarts", 0))
            self.replay_actors.num_lost_calls = int(counters.get("num_lost_replay_calls", 0))
            self.replay_actors.refill_steps = int(state.get("replay_refill_steps", 0))
        if self.aggregators is not None:
            self.aggregators.num_restarts = int(counters.get("num_aggregator_restarts", 0))
        if self.learners is not None:
            self.learners.num_restarts = int(counters.get("num_learner_restarts", 0))
        for kind, budget in self._restart_budgets().items():  # restarts in the window go on counting
            budget.set_state(state.get("restart_times", {}).get(kind, []))
        reader = None if directory is None else ArrayFileReader(directory)
        if self.replay_buffer is not None and "replay_buffer" in state:
            self.replay_buffer.set_state(state["replay_buffer"], read_column=reader)
        shards: Sequence[Any] = state.get("replay_shards", [])
        if self.replay_actors and shards:
            if len(shards) != len(self.replay_actors):
                if allow_partial:
                    self._refill(())
                    return
                raise CheckpointError(
                    f"the checkpoint holds {len(shards)} replay shards, this run has {len(self.replay_actors)}; "
                    "restore with the checkpoint's num_replay_shards"
                )
            where = None if directory is None else str(directory)
            nbytes = 0 if directory is None else sum(f.stat().st_size for f in directory.glob("replay_shard_*.npy"))
            timeout_s = STATE_TIMEOUT_S + nbytes / SLOWEST_REPLAY_BYTES_PER_S
            self._ask_shards("set_state", [(shard, where) for shard in shards], timeout_s)
        self._refill(shards)

    def _refill(self, shards: Sequence[Any]) -> None:
        """Shards restored without rows replay again only after sampling refilled them: without this,
        Ape-X's throttle (sampled steps held to what was trained) and an empty tier would wait on each other."""
        if isinstance(self.replay_actors, ReplayShards):
            for index in range(len(self.replay_actors)):
                if index >= len(shards) or not LocalReplayBuffer.state_holds_rows(shards[index]):
                    self.replay_actors.starts_empty(index)

    def _restart_budgets(self) -> dict[str, RestartBudget]:
        budgets = {}
        if isinstance(self.replay_actors, ReplayShards):
            budgets["replay_shards"] = self.replay_actors.restart_budget
        if self.aggregators is not None:
            budgets["aggregators"] = self.aggregators.restart_budget
        return budgets

    def _restart_times(self) -> dict[str, list[float]]:
        """The times of the replay shards' and aggregators' restarts that count against their caps now."""
        return {kind: budget.get_state() for kind, budget in self._restart_budgets().items()}

    def stats(self) -> dict[str, Any]:
        """Learner queue and throughput, replay sizes: what ``result["info"]`` reports of them."""
        stats: dict[str, Any] = {}
        if self.learner is not None:
            stats["learner_thread"] = self.learner.stats()
        if self.replay_buffer is not None:
            stats["replay_buffer"] = self.replay_buffer.stats()
        if self.replay_actors:
            args = [()] * len(self.replay_actors)
            stats["replay_shards"] = self._ask_shards("stats", args, STATS_TIMEOUT_S, replace_dead=True)
        return stats

    def _ask_shards(
        self,
        method: str,
        args: Sequence[tuple[Any, ...]],
        timeout_s: float,
        replace_dead: bool = False,
        skip_dead: bool = False,
    ) -> list[Any]:
        """Each replay shard's answer to ``method(*args[i])``, all within ``timeout_s``.

        A shard that gives no answer in time, or is dead, raises
        :class:`~flowrl.errors.ReplayShardError` naming it; with ``replace_dead`` a dead shard
        of :class:`ReplayShards` is recreated instead, and its replacement answers; with
        ``skip_dead`` a dead shard's answer is None (with a warning that its rows are left out).
        """
        actors = list(self.replay_actors)
        refs = [getattr(actor, method).remote(*call_args) for actor, call_args in zip(actors, args)]
        deadline = time.monotonic() + timeout_s
        answers: list[Any] = []
        for index, (actor, ref) in enumerate(zip(actors, refs)):
            try:
                answers.append(ray.get(ref, timeout=max(0.0, deadline - time.monotonic())))
            except ray.exceptions.GetTimeoutError as e:
                raise ReplayShardError(f"replay shard {index} gave no answer to {method} within {timeout_s} s") from e
            except ray.exceptions.RayActorError as e:
                if skip_dead:
                    logger.warning(
                        "replay shard %d is dead and past its restart cap: %s leaves its rows out", index, method
                    )
                    answers.append(None)
                    continue
                if not (replace_dead and isinstance(self.replay_actors, ReplayShards)):
                    raise ReplayShardError(
                        f"replay shard {index} died before it answered {method}: its rows are lost"
                    ) from e
                replacement = self.replay_actors.replace(actor, e)
                ref = getattr(replacement, method).remote(*args[index])
                try:
                    # A time of its own: a new actor starts a process and imports flowrl first.
                    answers.append(ray.get(ref, timeout=timeout_s))
                except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as e2:
                    raise ReplayShardError(
                        f"replay shard {index} was recreated; its replacement did not answer {method}"
                    ) from e2
        return answers


def learner_resources(workers: WorkerSet, config: TrainerConfig) -> PlanResources:
    """The declaration of algorithms whose plans wire only rollout workers and the learner group
    ``config`` asks for (``num_learners >= 2``; none otherwise)."""
    return PlanResources(learners=learner_group(workers, config))


def local_replay_buffer(config: ReplayConfig) -> LocalReplayBuffer:
    """A local replay buffer with ``config``'s replay settings."""
    return LocalReplayBuffer(**replay_buffer_args(config))


def replay_shards(
    config: ReplayConfig,
    num_shards: int,
    *,
    num_cpus: float = 0.0,
    placement: str = "driver_node",
    reservation: Reservation | None = None,
) -> ReplayShards:
    """``num_shards`` replay shard actors of ``num_cpus`` CPUs each, splitting ``config``'s replay capacity
    and ``learning_starts`` (a dead one is recreated empty), placed as :class:`~flowrl.actors.ReplayShards` says."""
    return create_replay_actors(
        num_shards,
        num_cpus=num_cpus,
        placement=placement,
        reservation=reservation,
        time_handoffs=config.profile,
        restart_budget=RestartBudget("replay shard", config.max_worker_restarts, config.restart_window_s),
        **replay_buffer_args(config),
    )
