"""Offline→online in one run: the ``pretrain`` phase and the ``replay_prefill`` of a run.

The pretraining phase is a plan of its own: a Trainer of the offline algorithm (``bc``, ``marwil`` or
``cql``) over the recorded experiences, in this process, with the run's model settings. After each of
its iterations its policy's weights go to the run's policies (and to their target networks, learner
group and rollout workers), so the run's evaluation follows the pretraining, a checkpoint taken then
holds the pretrained weights, and the online plan starts from them. ``replay_prefill`` adds recorded
experiences to the run's replay buffer, postprocessed by its policy, before its first training iteration.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from flowrl.actors import PlanResources, WorkerSet
from flowrl.actors.offline_input import open_input
from flowrl.data import DEFAULT_POLICY_ID, SampleBatch, concat_samples
from flowrl.errors import ConfigError
from flowrl.operators.offline_ops import episode_pieces

if TYPE_CHECKING:
    from flowrl.config import TrainerConfig
    from flowrl.engine.trainer import Trainer

#: Keys of the run's config the pretraining algorithm takes too: what its policy's network looks like.
SHARED_KEYS = ("model", "gamma", "seed", "observation_filter", "env_config", "clip_actions", "profile")
#: What a pretraining iteration's result keeps of the pretraining Trainer's, under ``pretrain/``.
REPORTED = ("timesteps_total", "training_iteration", "time_this_iter_s", "info")


class Pretraining:
    """The ``pretrain`` phase of a run: ``iterations`` iterations of ``algo`` on ``input``, whose weights are
    handed to the run's policies after each. Raises :class:`~flowrl.errors.ConfigError` when the two
    algorithms' networks differ (their weights could not be handed over)."""

    def __init__(self, env: Any, config: TrainerConfig, workers: WorkerSet, resources: PlanResources) -> None:
        from flowrl.engine.trainer import Trainer  # the phase is a Trainer of its own

        spec = dict(config.pretrain or {})
        self.algo: str = spec["algo"]
        self.iterations: int = spec["iterations"]
        self.done = 0
        self.workers = workers
        self.resources = resources
        shared = {key: getattr(config, key) for key in SHARED_KEYS}
        settings = {**shared, "num_workers": 0, "evaluation_interval": None, **spec.get("config", {})}
        self.trainer: Trainer = Trainer(self.algo, env, {**settings, "input": spec["input"]})
        self._stopped = False
        try:
            self._check_networks()
        except ConfigError:
            self.stop()
            raise

    @property
    def running(self) -> bool:
        """Whether iterations of the phase are left."""
        return self.done < self.iterations

    def _check_networks(self) -> None:
        theirs = self.trainer.workers.local_worker().get_weights([DEFAULT_POLICY_ID])[DEFAULT_POLICY_ID]
        ours = self.workers.local_worker().get_weights([DEFAULT_POLICY_ID])[DEFAULT_POLICY_ID]
        shapes = {name: np.shape(value) for name, value in theirs.items()}
        wanted = {name: np.shape(value) for name, value in ours.items()}
        if shapes != wanted:
            differ = sorted(set(shapes) ^ set(wanted)) or [k for k in shapes if shapes[k] != wanted[k]]
            raise ConfigError(
                [
                    f"pretrain: {self.algo!r}'s network differs from this algorithm's ({differ[:4]} ...), so its "
                    f"weights cannot be handed over; pretrain actor-critics (ppo, impala, appo, a2c, pg) with bc or "
                    "marwil and Q-learners (dqn, sac) with cql, with the same model settings"
                ]
            )

    def train(self) -> dict[str, Any]:
        """One pretraining iteration, its weights handed over; returns its result's :data:`REPORTED` keys."""
        result = self.trainer.train()
        self.done += 1
        self.hand_over()
        return {key: result[key] for key in REPORTED if key in result} | {"plan": result.get("plan", {})}

    def hand_over(self) -> None:
        """The pretrained weights into the run's policy, its target network, learner group and rollout workers."""
        weights = self.trainer.workers.local_worker().get_weights([DEFAULT_POLICY_ID])
        local = self.workers.local_worker()
        local.set_weights(weights)
        policy = local.get_policy(DEFAULT_POLICY_ID)
        if getattr(policy, "target_network", None) is not None:
            policy.update_target(1.0)
        if self.resources.learners is not None:
            self.resources.learners.sync()
        self.workers.sync_weights()

    def restore(self, done: int) -> None:
        """Continue a restored run's phase after ``done`` iterations, from the weights the run's policy holds."""
        self.done = done
        weights = self.workers.local_worker().get_weights([DEFAULT_POLICY_ID])
        self.trainer.workers.local_worker().set_weights(weights)

    def stop(self) -> None:
        """Release the pretraining Trainer (idempotent)."""
        if not self._stopped:
            self._stopped = True
            self.trainer.stop()


class OfflinePhases:
    """What a run does with recorded experiences besides its plan: the ``pretrain`` phase (first) and the
    ``replay_prefill`` (once, before the first online iteration); their progress is checkpointed."""

    def __init__(self, env: Any, config: TrainerConfig, workers: WorkerSet, resources: PlanResources) -> None:
        self.pretraining = Pretraining(env, config, workers, resources) if config.pretrain else None
        self.prefill_source = config.replay_prefill
        self.prefilled_rows: int | None = None if self.prefill_source else 0
        if self.prefill_source and resources.replay_buffer is None:
            raise ConfigError(
                [
                    f"replay_prefill={self.prefill_source!r}: this algorithm has no local replay buffer to fill; "
                    "dqn, sac, ddpg and td3 have one"
                ]
            )

    @property
    def pretraining_now(self) -> bool:
        """Whether the next iteration is a pretraining one."""
        return self.pretraining is not None and self.pretraining.running

    def pretrain_iteration(self, online_steps: int) -> dict[str, Any]:
        """A pretraining iteration's result: the pretraining plan's (its X-ray as ``plan``) under ``pretrain/``,
        ``timesteps_total`` the online env steps (none yet), ``phase`` "pretrain"."""
        assert self.pretraining is not None
        phase = self.pretraining.train()
        info = dict(phase.get("info", {}))
        return {
            "phase": "pretrain",
            "pretrain": {key: phase[key] for key in REPORTED if key in phase} | {"algo": self.pretraining.algo},
            "timesteps_total": online_steps,
            "episode_reward_mean": float("nan"),
            "episodes_this_iter": 0,
            "info": {"learner": info.get("learner", {})},
            "plan": phase["plan"],
        }

    def start_online(self, trainer: Trainer) -> dict[str, Any]:
        """Before an online iteration: end the pretraining phase, prefill the replay buffer once; the keys the
        result gets (``phase``, ``info/replay_prefill_rows``)."""
        if self.pretraining is not None:
            self.pretraining.stop()
        if self.prefilled_rows is None:
            assert self.prefill_source is not None
            self.prefilled_rows = prefill_replay(trainer, self.prefill_source)
        return {"phase": "online"} if self.pretraining is not None or self.prefill_source else {}

    def get_state(self) -> dict[str, Any]:
        return {
            "pretrain_iterations": None if self.pretraining is None else self.pretraining.done,
            "prefilled_rows": self.prefilled_rows,
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        done = state.get("pretrain_iterations")
        if self.pretraining is not None and done is not None:
            self.pretraining.restore(int(done))
        if state.get("prefilled_rows") is not None:
            self.prefilled_rows = int(state["prefilled_rows"])

    def stop(self) -> None:
        if self.pretraining is not None:
            self.pretraining.stop()


def prefill_replay(trainer: Trainer, source: str) -> int:
    """Add ``source``'s experiences to ``trainer``'s replay buffer with the columns sampling gives its rows,
    each episode piece postprocessed by its policy as sampled ones are (n-step); returns the rows added.

    Columns the policy's acting adds (e.g. ``action_logp``) that the data lacks are filled with the policy's
    outputs for the data's observations: the replay buffer holds one set of columns, and the value-based
    losses do not read them."""
    buffer = trainer.resources.need_replay_buffer()
    workers = trainer.workers
    columns = [SampleBatch.OBS, SampleBatch.ACTIONS, SampleBatch.REWARDS, SampleBatch.NEW_OBS, SampleBatch.TERMINATEDS]
    data = open_input(source, workers.policy_specs, columns=columns, why="replayed transitions need them")
    policy = workers.local_worker().get_policy(DEFAULT_POLICY_ID)
    added = 0
    for batch in data.iter_batches(10_000):
        _, extras = policy.compute_actions(batch[SampleBatch.OBS], explore=False)
        wanted = SAMPLED | set(extras) | ({SampleBatch.ACTION_MASK, SampleBatch.NEXT_ACTION_MASK} & set(batch))
        rows = SampleBatch({key: batch[key] if key in batch else extras[key] for key in wanted})
        pieces = [policy.postprocess_trajectory(piece) for piece in episode_pieces(rows)]
        rows = concat_samples(pieces) if len(pieces) > 1 else pieces[0]
        buffer.add_batch(rows)
        added += rows.count
    return added


#: The columns sampling gives every row (besides those the policy's acting adds).
SAMPLED = frozenset(
    {
        SampleBatch.OBS,
        SampleBatch.ACTIONS,
        SampleBatch.REWARDS,
        SampleBatch.NEW_OBS,
        SampleBatch.TERMINATEDS,
        SampleBatch.TRUNCATEDS,
        SampleBatch.EPS_ID,
        SampleBatch.T,
        SampleBatch.ENV_ID,
    }
)
