"""Test doubles and small builders shared by the test modules.

Imported as ``fakes``: setup.cfg's ``pythonpath = tests`` puts this directory on the path.
Everything here runs without Ray; a stand-in keeps only what the operators under test use
of the real object (a :class:`~flowrl.actors.WorkerSet`, a rollout worker, a policy): the
Protocols those operators are typed with (:mod:`flowrl.actors.protocols`, :mod:`flowrl.policy.protocols`).
"""

from __future__ import annotations

import hashlib
import json
import pickle
import sys
import time
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import cloudpickle
import gymnasium as gym
import numpy as np
import ray.cloudpickle
import torch

from flowrl.actors import WorkerMetrics, WorkerSet
from flowrl.data import DEFAULT_POLICY_ID, SampleBatch
from flowrl.envs import EnvContext
from flowrl.iterators import LocalIterator
from flowrl.operators import STEPS_SAMPLED_COUNTER, STEPS_TRAINED_COUNTER
from flowrl.policy import LearnOutput, TorchPolicy

if TYPE_CHECKING:
    from flowrl import Trainer

# Ray's worker processes cannot import this module (pytest's ``pythonpath`` reaches only the
# test process), so a function from here sent to them, such as bc_loss in a PolicySpec,
# travels by value rather than by name.
for _pickler in (ray.cloudpickle, cloudpickle):
    _pickler.register_pickle_by_value(sys.modules[__name__])

R = TypeVar("R")

#: flowrl's own algorithms (list_algorithms() also lists those a test session registers, e.g. the docs').
BUILT_IN_ALGORITHMS = (
    "pg",
    "a2c",
    "a3c",
    "ppo",
    "dqn",
    "apex",
    "apex_ddpg",
    "r2d2",
    "ddpg",
    "td3",
    "sac",
    "impala",
    "appo",
    "ppo_dqn",
    "es",
    "ars",
    "bc",
    "marwil",
    "cql",
)

# --- dataflow builders ---


def from_list(items: Iterable[Any]) -> LocalIterator[Any]:
    """A local iterator over ``items``, copied first so that a generator can be passed too."""
    items = list(items)
    return LocalIterator(lambda timeout: iter(items))


def add_steps(sampled: int = 0, trained: int = 0) -> Callable[[Any], Any]:
    """A pass-through step that adds to the plan's sampled and trained step counters, as rollouts and training do."""

    def fn(item: Any) -> Any:
        counters = LocalIterator.get_metrics().counters
        counters[STEPS_SAMPLED_COUNTER] += sampled
        counters[STEPS_TRAINED_COUNTER] += trained
        return item

    return fn


def id_batch(n: int) -> SampleBatch:
    """``n`` rows numbered 0..n-1 in an ``id`` column, with a reward of 1 each."""
    return SampleBatch({"id": np.arange(n), SampleBatch.REWARDS: np.ones(n, np.float32)})


# --- losses ---


def bc_loss(policy: TorchPolicy, model: torch.nn.Module, dist_class: Any, batch: dict[str, torch.Tensor]) -> Any:
    """Behaviour cloning with no stats: minimise the negative log-likelihood of the batch's actions."""
    logits, _ = model(batch[SampleBatch.OBS])
    return -dist_class(logits).logp(batch[SampleBatch.ACTIONS]).mean(), {}


# --- workers without Ray ---


class FakePolicy:
    """A :class:`~flowrl.policy.protocols.LearningPolicy` that records every learn_on_batch call; stats
    are the call number so their mean is known."""

    def __init__(self) -> None:
        self.calls: list[np.ndarray] = []
        self.grads_applied: list[Any] = []
        self.target_updates = 0
        self.last_tau: float | None = None
        self.num_nonfinite_updates = 0

    def learn_on_batch(self, batch: SampleBatch) -> dict[str, float]:
        self.calls.append(np.array(batch["id"]))
        return {"loss": float(len(self.calls)), "rows": float(batch.count)}

    def learn(self, batch: SampleBatch) -> LearnOutput:
        return LearnOutput(self.learn_on_batch(batch))

    def compute_gradients(self, batch: SampleBatch) -> tuple[list[np.ndarray], dict[str, float]]:
        return [np.full(2, float(batch.count))], {"grad_loss": 1.5}

    def update_target(self, tau: float = 1.0) -> None:
        self.target_updates += 1
        self.last_tau = tau


class FakeWorker:
    """A :class:`~flowrl.actors.protocols.LocalWorkerLike` rollout worker: a :class:`FakePolicy` per policy id,
    the gradients applied, and scripted episodes.

    ``episodes`` holds one list of ``(reward, length)`` episodes per ``get_metrics()`` call;
    once they run out, a call reports none.
    """

    def __init__(
        self, episodes: Sequence[Sequence[tuple[float, int]]] = (), *, policy_ids: Iterable[str] = (DEFAULT_POLICY_ID,)
    ) -> None:
        self.policy_map = {pid: FakePolicy() for pid in policy_ids}
        self.applied: list[tuple[list[np.ndarray], str]] = []
        self.global_vars: list[dict[str, Any]] = []
        self.pending = [[{"episode_reward": r, "episode_length": n} for r, n in batch] for batch in episodes]

    def get_policy(self, policy_id: str = DEFAULT_POLICY_ID) -> FakePolicy:
        return self.policy_map[policy_id]

    def policy_class(self, policy_id: str = DEFAULT_POLICY_ID) -> type:
        return type(self.policy_map[policy_id])

    def compute_gradients(
        self, batch: SampleBatch, policy_id: str = DEFAULT_POLICY_ID
    ) -> tuple[list[np.ndarray], dict[str, float]]:
        return self.policy_map[policy_id].compute_gradients(batch)

    def apply_gradients(self, gradients: list[np.ndarray], policy_id: str = DEFAULT_POLICY_ID) -> None:
        self.applied.append((gradients, policy_id))

    def set_global_vars(self, global_vars: Mapping[str, Any]) -> None:
        self.global_vars.append(dict(global_vars))

    def get_weights(self, policies: list[str] | None = None) -> dict[str, Any]:
        return {pid: {"w": np.zeros(1)} for pid in (policies or self.policy_map)}

    def get_metrics(self) -> WorkerMetrics:
        return WorkerMetrics(self.pending.pop(0) if self.pending else [])


class FakeWorkerSet:
    """A :class:`~flowrl.actors.protocols.WorkerSetLike` (what the operators use of a WorkerSet), recording
    weight syncs and the global vars sent.

    ``FakeWorkerSet("p1", "p2")`` has a local worker with those policies (default: the
    default policy) and no remote workers; ``local=`` and ``remotes=`` give the workers instead.
    """

    def __init__(self, *policy_ids: str, local: FakeWorker | None = None, remotes: Sequence[FakeWorker] = ()) -> None:
        if local is not None and policy_ids:
            raise ValueError("FakeWorkerSet: give policy ids or a local worker, not both")
        self.local = local if local is not None else FakeWorker(policy_ids=policy_ids or (DEFAULT_POLICY_ID,))
        self.remotes = list(remotes)
        self.num_worker_restarts = 0
        self.num_workers_missing = 0
        self.num_slow_workers = 0
        self.syncs: list[tuple[list[str] | None, Mapping[str, Any] | None]] = []
        self.global_vars: list[Mapping[str, Any]] = []

    def local_worker(self) -> FakeWorker:
        return self.local

    def remote_workers(self) -> list[FakeWorker]:
        return list(self.remotes)

    def remote_worker_indices(self) -> list[int]:
        return list(range(1, len(self.remotes) + 1))

    def num_healthy_workers(self) -> int:
        return len(self.remotes)

    def collect_metrics(self) -> list[tuple[int, WorkerMetrics]]:
        if not self.remotes:
            return [(0, self.local.get_metrics())]
        return [(i + 1, w.get_metrics()) for i, w in enumerate(self.remotes)]

    def trainable_policies(self) -> list[str]:
        return list(self.local.policy_map)

    def sync_weights(self, policies: list[str] | None = None, global_vars: Mapping[str, Any] | None = None) -> None:
        self.syncs.append((policies, global_vars))

    def remember_global_vars(self, global_vars: Mapping[str, Any]) -> None:
        self.global_vars.append(global_vars)

    def foreach_worker(self, fn: Callable[[FakeWorker], R], local: bool = True) -> list[R]:
        return ([fn(self.local)] if local else []) + [fn(w) for w in self.remotes]


# --- real worker sets ---


def weights_of(workers: WorkerSet) -> list[dict[str, np.ndarray]]:
    """The default policy's weights on every worker of a (Ray) WorkerSet, the local worker's first."""
    return workers.foreach_worker(lambda w: w.get_weights()[DEFAULT_POLICY_ID])


# --- trainers ---


def fingerprint(trainer: Trainer) -> dict[str, Any]:
    """Hashes of the local policy's weights and optimizer state, its coefficients, counters and iteration."""
    policy = trainer.workers.local_worker().get_policy()
    weights = hashlib.sha256()
    for key, value in sorted(policy.get_weights().items()):
        weights.update(key.encode())
        weights.update(np.ascontiguousarray(value).tobytes())
    optimizer = hashlib.sha256()
    for index, state in sorted(policy.optimizer.state_dict()["state"].items()):
        for name, tensor in sorted(state.items()):
            optimizer.update(f"{index}.{name}".encode())
            optimizer.update(torch.as_tensor(tensor).detach().cpu().numpy().tobytes())
    return {
        "weights": weights.hexdigest(),
        "optimizer": optimizer.hexdigest(),
        "coeffs": dict(policy.coeffs),
        "counters": dict(trainer.plan.metrics.counters),
        "iteration": trainer.iteration,
    }


# --- run directories ---


def progress(run_dir: Path) -> list[dict[str, Any]]:
    """The results a run wrote to its ``progress.jsonl``, one per line."""
    return [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]


def checkpoints(run_dir: Path) -> list[str]:
    """The names of a run's finished checkpoints (hidden, half-written ones left out), sorted."""
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir() if not p.name.startswith("."))


def is_dead(actor: Any, timeout_s: float = 30.0) -> bool:
    """Whether ``actor`` dies within ``timeout_s``: ``ray.kill`` is asynchronous, so a call made
    right after it may still be served; ask until the actor is gone or the time is up."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ping.remote(), timeout=max(0.1, deadline - time.monotonic()))
        except ray.exceptions.RayActorError:
            return True
        except ray.exceptions.GetTimeoutError:
            return False
        time.sleep(0.05)
    return False


def snapshot_of_a_vanished_class() -> bytes:
    """An env snapshot whose class lives in a module this process does not have (as after an upgrade)."""
    module = types.ModuleType("flowrl_test_env_of_another_version")
    gone = type("GoneEnv", (), {"__module__": module.__name__})
    setattr(module, "GoneEnv", gone)
    sys.modules[module.__name__] = module
    try:
        return pickle.dumps(gone())
    finally:
        del sys.modules[module.__name__]


# --- envs that report or break where they run (env_config is an EnvContext) ---


class RecordsContext(gym.Wrapper):
    """CartPole that keeps the EnvContext it was built with."""

    def __init__(self, env_config: EnvContext) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.context = (
            env_config.worker_index,
            env_config.vector_index,
            env_config.num_workers,
            env_config.recreated_worker,
        )
        self.user_keys = dict(env_config)


class FailsWhenRecreated(gym.Wrapper):
    """CartPole whose creator raises in a worker that replaces a failed one."""

    def __init__(self, env_config: EnvContext) -> None:
        if env_config.recreated_worker:
            raise RuntimeError(f"cannot start again on worker {env_config.worker_index}")
        super().__init__(gym.make("CartPole-v1"))


class FailsFirstRecreations(gym.Wrapper):
    """CartPole whose creator raises in the first ``env_config["failed_starts"]`` workers that replace a failed
    one (each failure leaves a file in ``env_config["count_dir"]``, which every process on the node sees)."""

    def __init__(self, env_config: EnvContext) -> None:
        if env_config.recreated_worker:
            count_dir = Path(env_config["count_dir"])
            failed = len(list(count_dir.iterdir()))
            if failed < env_config["failed_starts"]:
                (count_dir / f"failed_start_{failed}").touch()
                raise RuntimeError(f"start {failed + 1} of a replacement of worker {env_config.worker_index} fails")
        super().__init__(gym.make("CartPole-v1"))


class SlowToStartWhenRecreated(gym.Wrapper):
    """CartPole whose creator takes ``env_config["start_s"]`` seconds in a worker that replaces a failed one
    (a replacement that waits, as for room on a lost node)."""

    def __init__(self, env_config: EnvContext) -> None:
        if env_config.recreated_worker:
            time.sleep(env_config["start_s"])
        super().__init__(gym.make("CartPole-v1"))


class CloseRaises(gym.Wrapper):
    """CartPole whose close() raises."""

    def __init__(self, env_config: EnvContext) -> None:
        super().__init__(gym.make("CartPole-v1"))

    def close(self) -> None:
        raise OSError("simulator socket already gone")


def train_to_reward(trainer: Trainer, threshold: float, budget: int) -> None:
    """Train (then stop) ``trainer`` until its mean episode reward reaches ``threshold``; fail past
    ``budget`` env steps."""
    curve: list[float] = []
    try:
        while True:
            result = trainer.train()
            curve.append(round(result["episode_reward_mean"], 1))
            if result["episode_reward_mean"] >= threshold or result["timesteps_total"] >= budget:
                break
    finally:
        trainer.stop()
    assert result["episode_reward_mean"] >= threshold, (
        f"mean reward {curve[-1]} after {result['timesteps_total']} steps; curve {curve}"
    )
