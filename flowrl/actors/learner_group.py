"""Learner groups: N learner actors training replicas of the policies data-parallel on torch.distributed.

Each :class:`LearnerActor` holds a replica of every trained policy and its optimizer and joins
one process group with the others (gloo on CPU, NCCL when each has a GPU). :meth:`LearnerGroup.learn`
puts a batch in the object store once; every replica runs the same epochs and shuffles on its
:class:`Shard` of each minibatch and averages gradients with the others before each step
(:mod:`flowrl.policy.data_parallel`), so the replicas stay equal to what one learner would
compute. Rank 0's weights and optimizer state then go to the driver's local policies, from which
the rollout workers and checkpoints read as before; what the driver changes between rounds
(loss coefficients, the global timestep, target networks, live config, a restored checkpoint) goes to every replica.
A learner that dies or hangs ends the round: the group is rebuilt from the driver's policies
and the batch learned again (``num_restarts``).

The group's rendezvous (rank 0's torch.distributed store) listens on rank 0's node address only,
and gloo's connections on each node's interface of its address; neither authenticates its peers,
so a learner group belongs inside a trusted network (see docs/cluster.md, "Security").
"""

from __future__ import annotations

import datetime
import functools
import ipaddress
import os
import socket
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from flowrl.actors.learned import Learned
from flowrl.actors.placeholders import PlaceholderActor, placeholders_active
from flowrl.actors.placement import LEARNER
from flowrl.data import MultiAgentBatch, SampleBatch, as_policy_batches
from flowrl.data.replay_buffer import BATCH_INDEXES
from flowrl.deferred import dist, ray, torch
from flowrl.errors import FlowRLError
from flowrl.policy import Policy, PolicySpec, TorchPolicy
from flowrl.policy.data_parallel import Shard, synchronize_gradients
from flowrl.policy.devices import on_cpu
from flowrl.policy.sgd import minibatch_sgd

if TYPE_CHECKING:
    from flowrl.actors.worker_set import WorkerSet
    from flowrl.config import TrainerConfig

Batch = SampleBatch | MultiAgentBatch
#: The actor class name plan graphs show for a group's learners.
LEARNER_ACTOR = "LearnerActor"


class LearnerActor:
    """One replica of the trained policies, rank ``rank`` of a learner group once it has joined.

    ``num_gpus`` > 0 puts the replicas on the GPU Ray gave this actor; PyTorch uses ``num_threads``
    threads. ``seed`` (None: unseeded) seeds PyTorch per rank and incarnation, so that the shards'
    random draws (TD3's target noise) differ from one another.
    """

    def __init__(
        self,
        policy_specs: Mapping[str, PolicySpec],
        num_gpus: float,
        num_threads: int,
        seed: int | None,
        incarnation: int,
    ) -> None:
        torch.set_num_threads(num_threads)
        overrides = {"num_gpus": num_gpus}
        self.policies: dict[str, Policy[Any]] = {pid: spec.build(overrides) for pid, spec in policy_specs.items()}
        self.shard = Shard(0, 1)
        self.seed = seed
        self.incarnation = incarnation
        self._listener: socket.socket | None = None

    def address(self) -> tuple[str, int]:
        """This node's cluster address and a port listening there (on no other interface) for the
        group's rendezvous (asked of rank 0, whose :meth:`join` hands the socket to the store)."""
        host = ray.util.get_node_ip_address()
        listener = socket.socket(socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET)
        listener.bind((host, 0))
        listener.listen()
        self._listener = listener
        return host, int(listener.getsockname()[1])

    def join(self, host: str, port: int, rank: int, size: int, timeout_s: float) -> None:
        """Join the group of ``size`` replicas as ``rank``; gradients are averaged with the others from now on."""
        on_gpu = any(isinstance(p, TorchPolicy) and p.device.type == "cuda" for p in self.policies.values())
        timeout = datetime.timedelta(seconds=timeout_s)
        if not on_gpu:
            _gloo_on_the_interface_of(ray.util.get_node_ip_address())
        if self._listener is not None:  # rank 0: the store serves on the socket address() bound
            store = dist.TCPStore(host, port, size, True, timeout, master_listen_fd=self._listener.detach())
            self._listener = None
        else:
            store = dist.TCPStore(host, port, size, False, timeout)
        dist.init_process_group("nccl" if on_gpu else "gloo", store=store, rank=rank, world_size=size, timeout=timeout)
        self.shard = Shard(rank, size)
        if self.seed is None:
            torch.seed()
        else:
            torch.manual_seed(int(np.random.SeedSequence([self.seed, rank, self.incarnation]).generate_state(1)[0]))
        for policy in self.policies.values():
            if not isinstance(policy, TorchPolicy):
                raise FlowRLError(f"a learner group trains TorchPolicy replicas, got {type(policy).__name__}")
            policy.gradient_sync = synchronize_gradients

    def set_state(self, states: Mapping[str, Mapping[str, Any]]) -> None:
        for pid, state in states.items():
            self.policies[pid].set_state(state)

    def get_state(self, policies: Sequence[str]) -> dict[str, dict[str, Any]]:
        return {pid: self.policies[pid].get_state() for pid in policies}

    def update_config(self, changes: Mapping[str, Any]) -> None:
        for policy in self.policies.values():
            policy.update_config(changes)

    def update_targets(self, moves: Sequence[tuple[Sequence[str], float]]) -> None:
        """Move target networks as the driver moved its own: each move is (policies, tau), in order."""
        for policies, tau in moves:
            for _, policy in self._torch(policies):
                policy.update_target(tau)

    def learner_state(self, policies: Sequence[str]) -> dict[str, tuple[Any, Any, dict[str, float], int]]:
        """Per policy, what learning changed: its weights, its optimizer's state (on CPU), its loss
        coefficients (TD3 counts its steps there) and its count of skipped non-finite updates."""
        return {
            pid: (
                policy.get_weights(),
                # Not a snapshot: the reply is serialized before this actor runs another step.
                on_cpu(policy.optimizer.state_dict(), copy=False),
                dict(policy.coeffs),
                policy.num_nonfinite_updates,
            )
            for pid, policy in self._torch(policies)
        }

    def _torch(self, policies: Sequence[str]) -> list[tuple[str, TorchPolicy[Any]]]:
        return [(pid, policy) for pid in policies if isinstance(policy := self.policies[pid], TorchPolicy)]

    def learn(
        self,
        batch: Batch,
        policies: Sequence[str],
        coeffs: Mapping[str, Mapping[str, float]],
        timesteps: Mapping[str, int],
        num_sgd_iter: int,
        sgd_minibatch_size: int,
        seed: int | list[int] | None,
        sequence_length: int,
        report_state: bool = False,
        target_updates: Sequence[tuple[Sequence[str], float]] = (),
    ) -> tuple[
        dict[str, dict[str, float]],
        dict[str, tuple[np.ndarray, np.ndarray]],
        dict[str, tuple[float, float]],
        dict[str, tuple[Any, Any, dict[str, float], int]] | None,
    ]:
        """Learn on this replica's shard of ``batch`` with the driver's loss ``coeffs`` and global ``timesteps``
        (what schedules read): per policy its statistics, the new priorities of its shard's replayed rows (a
        single step whose loss gives TD errors), the seconds it spent getting data ready and updating
        (:class:`~flowrl.policy.policy.LearnTimes`), and with ``report_state`` (asked of rank 0, in the same
        round trip) its :meth:`learner_state` after the update. ``target_updates`` (policies, tau), the driver's
        target moves since the last batch, are made first, in order."""
        self.update_targets(target_updates)
        for pid, replica in self._torch(list(coeffs)):
            replica.coeffs = dict(coeffs[pid])
        for pid, timestep in timesteps.items():
            self.policies[pid].on_global_var_update({"timestep": timestep})
        info: dict[str, dict[str, float]] = {}
        priorities: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        times: dict[str, tuple[float, float]] = {}
        for pid, policy_batch in as_policy_batches(batch).items():
            if pid not in policies:
                continue
            policy = self.policies[pid]
            before = (policy.learn_times.load_s, policy.learn_times.update_s)
            if num_sgd_iter == 1 and sgd_minibatch_size == 0:
                with policy.learn_times.loading():
                    rows = self.shard.rows(policy_batch, sequence_length)
                out = policy.learn(rows)
                info[pid] = out.stats
                if out.td_error is not None and BATCH_INDEXES in rows:
                    priorities[pid] = (rows[BATCH_INDEXES], out.td_error)
            else:
                info[pid] = minibatch_sgd(
                    policy, policy_batch, num_sgd_iter, sgd_minibatch_size, seed, sequence_length, shard=self.shard
                )
            times[pid] = (policy.learn_times.load_s - before[0], policy.learn_times.update_s - before[1])
        return info, priorities, times, self.learner_state(policies) if report_state else None


def _gloo_on_the_interface_of(address: str) -> None:
    """Have gloo listen on the network interface that holds ``address`` (by ``GLOO_SOCKET_IFNAME``).

    Left to itself gloo binds the address this host's name resolves to, which may be another
    interface (or loopback, which peers on other nodes cannot reach). A ``GLOO_SOCKET_IFNAME``
    the user set is kept; without psutil (which Ray ships) gloo chooses as before.
    """
    if "GLOO_SOCKET_IFNAME" in os.environ:
        return
    try:
        import psutil  # type: ignore[import-untyped]  # Ray's own copy is on the path of every Ray process
    except ImportError:
        return
    for interface, addresses in psutil.net_if_addrs().items():
        if any(entry.address == address for entry in addresses):
            os.environ["GLOO_SOCKET_IFNAME"] = interface
            return


@functools.cache
def _remote_learner_actor() -> Any:
    """:class:`LearnerActor` as a Ray actor class (made on first use: importing this module imports no Ray)."""
    return ray.remote(LearnerActor)


class LearnerGroup:
    """``size`` learner actors training the driver's ``policies`` of ``workers`` data-parallel.

    Every wait on the actors is bounded by ``timeout_s``, their start by ``startup_timeout_s``
    (:attr:`update_limit_s` bounds a whole :meth:`learn`). ``num_cpus``/``num_gpus`` are each
    actor's Ray resources (and its PyTorch threads: ``num_cpus``); actor ``rank`` runs in the
    ``learner`` bundle ``rank`` of the workers' reservation when the run reserved them. Inside
    :func:`~flowrl.actors.placeholders.placeholder_actors` the actors are placeholders.

    The replicas learn from the driver's policies as they were when the group started or last
    learned, plus the changes it is told of (:meth:`sync`, :meth:`update_config`,
    :meth:`update_target`, the coefficients sent with each batch): weights set on the driver's
    policies otherwise are replaced by rank 0's at the next update unless :meth:`sync` follows.
    """

    def __init__(
        self,
        workers: WorkerSet,
        policies: Sequence[str],
        size: int,
        *,
        timeout_s: float = 600.0,
        startup_timeout_s: float = 120.0,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        seed: int | None = None,
    ) -> None:
        if size < 2:
            raise FlowRLError(
                f"LearnerGroup(size={size}): a group has at least 2 learners (fewer: learn in the driver)"
            )
        self.workers = workers
        self.policies = list(policies)
        self.size = size
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.num_gpus = num_gpus
        self._options = {"num_cpus": num_cpus, "num_gpus": num_gpus}
        self.num_restarts = 0
        self.seed = seed
        self._num_threads = max(1, int(num_cpus))
        self._config_changes: dict[str, Any] = {}  # live config changes since the policy specs were made
        self._pending_targets: list[tuple[list[str], float]] = []  # target moves the next learn makes first
        self._placeholders = placeholders_active()
        self._stopped = False
        self._actors: list[Any] = []
        self._start()

    @property
    def update_limit_s(self) -> float:
        """The longest one :meth:`learn` can take: a failed attempt (2 waits), a rebuild (a start and
        3 waits) and the attempt again (2 waits)."""
        return 7 * self.timeout_s + self.startup_timeout_s

    @property
    def actors(self) -> list[Any]:
        """The learner actors, rank 0 first."""
        return list(self._actors)

    def _wait(self, refs: list[Any]) -> list[Any]:
        return ray.get(refs, timeout=self.timeout_s)

    def _start(self) -> None:
        if self._placeholders:
            self._actors = [PlaceholderActor(LEARNER_ACTOR) for _ in range(self.size)]
            return
        specs = {pid: self.workers.policy_specs[pid] for pid in self.policies}
        reservation = self.workers.reservation
        self._actors = [
            _remote_learner_actor()
            .options(**self._options, **reservation.options(LEARNER, rank))
            .remote(specs, self.num_gpus, self._num_threads, self.seed, self.num_restarts)
            for rank in range(self.size)
        ]
        try:
            # The first call waits for the actors to be scheduled and their processes to import flowrl.
            [(host, port)] = ray.get([self._actors[0].address.remote()], timeout=self.startup_timeout_s)
            self._wait(
                [
                    actor.join.remote(host, port, rank, self.size, self.timeout_s)
                    for rank, actor in enumerate(self._actors)
                ]
            )
            if self._config_changes:
                self._call_all("update_config", self._config_changes)
            self._call_all("set_state", self._driver_states())
            self._pending_targets = []  # the driver's targets have made those moves
        except BaseException:
            self._kill()
            raise

    def _driver_states(self) -> Any:
        local = self.workers.local_worker()
        return ray.put({pid: local.get_policy(pid).get_state() for pid in self.policies})

    def _call_all(self, method: str, *args: Any) -> list[Any]:
        return self._wait([getattr(actor, method).remote(*args) for actor in self._actors])

    def _tell_all(self, method: str, *args: Any) -> None:
        """Make every replica take a change the driver's policies already have; if one fails or hangs,
        the group is rebuilt from the driver's policies, which carries the change as well."""
        self._check_usable()
        try:
            self._call_all(method, *args)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as error:
            _raise_if_not_a_fault(error)
            self._restart()

    def _check_usable(self) -> None:
        if self._stopped or not self._actors:
            raise FlowRLError(
                "the learner group was stopped (or could not be rebuilt after a failure): it has no learners"
            )

    def sync(self) -> None:
        """Set every replica to the driver's policies as they are now: weights, optimizer state,
        coefficients, target networks (after a restore)."""
        self._tell_all("set_state", self._driver_states())
        self._pending_targets = []

    def update_config(self, changes: Mapping[str, Any]) -> None:
        """Change live config keys of every replica, as the driver's policies changed them (and of replacements)."""
        self._config_changes.update(changes)
        self._tell_all("update_config", dict(changes))

    def update_target(self, policies: Sequence[str], tau: float) -> None:
        """Move the replicas' target networks as the driver moved its own (the replicas' weights equal the driver's).

        No round trip of its own: the move travels with the next :meth:`learn`, before its batch, which is
        the first time the replicas read a target again (a rebuild or :meth:`sync` takes the driver's
        targets, which have moved already)."""
        self._check_usable()
        if wanted := [pid for pid in policies if pid in self.policies]:
            self._pending_targets.append((wanted, tau))

    def flush_targets(self) -> None:
        """Make the target moves that wait for the next :meth:`learn` now (for a reader of the replicas' state)."""
        if self._pending_targets:
            self._tell_all("update_targets", self._pending_targets)
            self._pending_targets = []

    def _kill(self) -> None:
        for actor in self._actors:
            ray.kill(actor)
        self._actors = []

    def _restart(self) -> None:
        if self._stopped:
            raise FlowRLError("a learner of the group failed while the group was being stopped")
        self._kill()
        self.num_restarts += 1
        try:
            self._start()
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as error:
            raise FlowRLError(f"a learner of the group failed and the group could not be rebuilt: {error}") from error

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
        """Learn on ``batch`` (``policies`` of the group's, default all) across the group, then set rank 0's
        weights and optimizer state in the driver's policies.

        A learner that fails or hangs: the group is rebuilt from the driver's policies (the
        state before this batch) and the batch learned again, once.
        """
        self._check_usable()
        wanted = self.policies if policies is None else list(policies)
        if not set(wanted) <= set(self.policies):
            raise FlowRLError(
                f"learn policies {sorted(set(wanted) - set(self.policies))} in a learner group of {self.policies}"
            )
        local = self.workers.local_worker()
        coeffs = {pid: dict(coeffs) for pid in wanted if (coeffs := getattr(local.get_policy(pid), "coeffs", None))}
        timesteps = {pid: local.get_policy(pid).global_timestep for pid in wanted}
        ref = ray.put(batch)
        for attempt in range(2):
            try:
                results = self._wait(
                    [
                        actor.learn.remote(
                            ref,
                            wanted,
                            coeffs,
                            timesteps,
                            num_sgd_iter,
                            sgd_minibatch_size,
                            seed,
                            sequence_length,
                            rank == 0,  # rank 0's state comes back with its results: no second round trip
                            self._pending_targets,
                        )
                        for rank, actor in enumerate(self._actors)
                    ]
                )
                break
            except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as error:
                _raise_if_not_a_fault(error)
                if attempt:
                    raise FlowRLError(f"the learner group failed twice on one batch: {error}") from error
                self._restart()
        self._pending_targets = []
        # The driver's policies follow rank 0 (weights, optimizer, coefficients, skipped updates):
        # rollout workers, checkpoints, metrics and a rebuilt group read them there.
        learned_state = results[0][3]
        assert learned_state is not None
        for pid, (weights, optimizer, learned_coeffs, nonfinite) in learned_state.items():
            policy = local.get_policy(pid)
            policy.set_weights(weights)
            policy.num_nonfinite_updates = nonfinite
            if isinstance(policy, TorchPolicy):
                policy.load_optimizer_state(optimizer)
                policy.coeffs = learned_coeffs
        for pid, (load_s, update_s) in results[0][2].items():  # rank 0's, as the X-ray's learner phases
            local.get_policy(pid).learn_times.add(load_s, update_s)
        info = {pid: _mean_stats([stats[pid] for stats, _, _, _ in results]) for pid in results[0][0]}
        priorities = {
            pid: (
                np.concatenate([p[pid][0] for _, p, _, _ in results]),
                np.concatenate([p[pid][1] for _, p, _, _ in results]),
            )
            for pid in results[0][1]
        }
        return Learned(None, info, batch.env_steps(), priorities)

    def stop(self) -> None:
        """Kill the learner actors (idempotent); an update in progress then fails instead of rebuilding the group."""
        self._stopped = True
        if not self._placeholders:
            self._kill()
        self._actors = []


def learner_group(workers: WorkerSet, config: TrainerConfig) -> LearnerGroup | None:
    """The learner group ``config`` asks for (``num_learners >= 2``) over the workers' trainable policies, else None."""
    if config.num_learners < 2:
        return None
    return LearnerGroup(
        workers,
        workers.trainable_policies(),
        config.num_learners,
        timeout_s=config.learner_timeout_s,
        startup_timeout_s=config.worker_startup_timeout_s,
        num_cpus=config.num_cpus_per_learner,
        num_gpus=config.num_gpus_per_learner,
        seed=config.seed,
    )


def _raise_if_not_a_fault(error: BaseException) -> None:
    """Re-raise what a learner's own code raised (flowrl's verdicts such as too many non-finite updates,
    a batch that cannot be shared) instead of taking it for a lost learner; a dead actor, a timeout or a
    failed collective (a RuntimeError from gloo or NCCL when a peer is gone) is a fault the group survives."""
    cause = getattr(error, "cause", None)
    if isinstance(error, ray.exceptions.RayTaskError) and cause is not None and not isinstance(cause, RuntimeError):
        raise cause from error
    if isinstance(cause, FlowRLError):
        raise cause from error


def _mean_stats(per_replica: list[Mapping[str, float]]) -> dict[str, float]:
    keys = dict.fromkeys(key for stats in per_replica for key in stats)
    return {key: float(np.mean([stats[key] for stats in per_replica if key in stats])) for key in keys}
