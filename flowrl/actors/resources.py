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

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Protocol

from flowrl.actors.aggregator import AggregatorSet
from flowrl.actors.learner_group import LearnerGroup, learner_group
from flowrl.actors.learner_thread import LearnerThread
from flowrl.actors.placeholders import placeholders_active
from flowrl.actors.placement import Reservation
from flowrl.actors.replay_shards import ReplayShards, create_replay_actors
from flowrl.data import LocalReplayBuffer
from flowrl.deferred import ray
from flowrl.errors import CheckpointError, FlowRLError, ReplayShardError

if TYPE_CHECKING:
    from flowrl.actors.worker_set import WorkerSet
    from flowrl.config import TrainerConfig

#: Longest wait for a replay shard's statistics, and for its state in a checkpoint.
STATS_TIMEOUT_S = 10.0
STATE_TIMEOUT_S = 300.0


class ReplayConfig(Protocol):
    """The replay keys of a config (DQN's and the algorithms built on its replay)."""

    buffer_size: int
    learning_starts: int
    train_batch_size: int
    prioritized_replay: bool
    prioritized_replay_alpha: float
    prioritized_replay_beta: float
    prioritized_replay_eps: float
    seed: int | None
    profile: bool


def replay_buffer_args(config: ReplayConfig) -> dict[str, Any]:
    """The replay settings of a config as keyword arguments of a replay buffer (or a tier of shards)."""
    return {
        "capacity": config.buffer_size,
        "learning_starts": config.learning_starts,
        "replay_batch_size": config.train_batch_size,
        "prioritized_replay_alpha": config.prioritized_replay_alpha,
        "prioritized_replay_beta": config.prioritized_replay_beta,
        "prioritized_replay_eps": config.prioritized_replay_eps,
        "prioritized": config.prioritized_replay,
        "seed": config.seed,
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

    def get_state(self) -> dict[str, Any]:
        """The replay buffers' state (their contents with ``checkpoint_replay_contents``) and the
        fault counters, for checkpoints.

        Learner threads and aggregators keep nothing that outlives a batch: the learner's
        policies are the local worker's, saved with it.
        """
        state: dict[str, Any] = {"fault_counters": self.fault_counters()}
        contents = self.checkpoint_replay_contents
        if self.replay_buffer is not None:
            state["replay_buffer"] = self.replay_buffer.get_state(include_contents=contents)
        if self.replay_actors:
            args = [(contents,)] * len(self.replay_actors)
            state["replay_shards"] = self._ask_shards("get_state", args, STATE_TIMEOUT_S)
        return state

    def set_state(self, state: Mapping[str, Any], *, allow_partial: bool = False) -> None:
        """Restore :meth:`get_state`'s output into resources of the same shape.

        Replay shards of another number are an error, or with ``allow_partial`` left empty.
        """
        counters = state.get("fault_counters", {})  # absent in checkpoints written before they were saved
        if isinstance(self.replay_actors, ReplayShards):
            self.replay_actors.num_restarts = int(counters.get("num_replay_shard_restarts", 0))
            self.replay_actors.num_lost_calls = int(counters.get("num_lost_replay_calls", 0))
        if self.aggregators is not None:
            self.aggregators.num_restarts = int(counters.get("num_aggregator_restarts", 0))
        if self.learners is not None:
            self.learners.num_restarts = int(counters.get("num_learner_restarts", 0))
        if self.replay_buffer is not None and "replay_buffer" in state:
            self.replay_buffer.set_state(state["replay_buffer"])
        shards: Sequence[Any] = state.get("replay_shards", [])
        if self.replay_actors and shards:
            if len(shards) != len(self.replay_actors):
                if allow_partial:
                    return
                raise CheckpointError(
                    f"the checkpoint holds {len(shards)} replay shards, this run has {len(self.replay_actors)}; "
                    "restore with the checkpoint's num_replay_shards"
                )
            self._ask_shards("set_state", [(shard,) for shard in shards], STATE_TIMEOUT_S)

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
        self, method: str, args: Sequence[tuple[Any, ...]], timeout_s: float, replace_dead: bool = False
    ) -> list[Any]:
        """Each replay shard's answer to ``method(*args[i])``, all within ``timeout_s``.

        A shard that gives no answer in time, or is dead, raises
        :class:`~flowrl.errors.ReplayShardError` naming it; with ``replace_dead`` a dead shard
        of :class:`ReplayShards` is recreated instead, and its replacement answers.
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
        **replay_buffer_args(config),
    )
