"""Evaluation during training: every ``evaluation_interval`` iterations, episodes with the current weights.

The :class:`Evaluator` is the Trainer's: on each iteration that is a multiple of
``evaluation_interval`` it plays ``evaluation_num_episodes`` episodes with the evaluation's
config (:func:`~flowrl.actors.evaluation.evaluation_settings`), with deterministic actions unless
``evaluation_config`` says ``explore: True``, and reports them in the result::

    result["evaluation"] = {"episode_reward_mean": ..., "episode_reward_min": ..., "episode_reward_max": ...,
                            "episode_len_mean": ..., "episodes": 10}
    result["num_evaluation_worker_restarts"] = 0   # on every iteration while evaluation is on

Evaluation episodes are played in envs of their own, so they never count in ``timesteps_total``,
``episodes_total`` or the training reward keys. With ``evaluation_num_workers=0`` the driver
plays them after the iteration, with its own copies of the policies; with N > 0, N evaluation
actors split them. For asynchronous algorithms (``Algorithm.asynchronous``) those actors are
sent their round before the iteration and collected after it, so training does not stall: the
evaluation at iteration n is of the weights the iteration started with.

With ``evaluation_video``, the first episode of each round is recorded where it is played and
its MP4 kept until :meth:`Evaluator.take_video` (a run writes it to ``videos/``): the bytes
never enter the result dict. An offline run with ``off_policy_estimation_methods`` also estimates the
policy's value on its recorded episodes (``evaluation/off_policy_estimation/<method>/...``,
:mod:`flowrl.engine.off_policy`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from flowrl.actors import WorkerSet
from flowrl.actors.evaluation import (
    EvaluationOutput,
    EvaluationWorker,
    EvaluationWorkers,
    episode_seeds,
    evaluation_explores,
    evaluation_settings,
)
from flowrl.config import TrainerConfig
from flowrl.engine.off_policy import ESTIMATES_KEY, OffPolicyEstimation
from flowrl.envs.registry import EnvCreator
from flowrl.envs.video import require_video_dependencies
from flowrl.operators.metric_ops import summarize_episodes
from flowrl.policy import PolicySpec
from flowrl.policy.filters import RunningStats

if TYPE_CHECKING:
    from flowrl.data.offline import OfflineData

#: The result key holding an evaluation's statistics (flattened: ``evaluation/episode_reward_mean``).
EVALUATION_KEY = "evaluation"
RESTARTS_KEY = "num_evaluation_worker_restarts"


class EvaluationVideo(NamedTuple):
    """The MP4 file of one evaluation episode, recorded at ``iteration``."""

    iteration: int
    mp4: bytes


class Evaluator:
    """Evaluates a trainer's current weights every ``config.evaluation_interval`` iterations (see the module docs).

    ``workers`` is the trainer's worker set: the weights come from its local worker, and the
    evaluation actors take their bundles in its reservation. ``parallel``: the plan trains
    asynchronously, so evaluation actors run beside the iteration. With evaluation off
    (``evaluation_interval`` None or 0) it starts nothing and adds nothing to results. ``offline``: the
    run's experiences, on which each evaluation also estimates the policy's value when the config names
    ``off_policy_estimation_methods`` (:mod:`flowrl.engine.off_policy`).
    """

    def __init__(
        self,
        config: TrainerConfig,
        env_creator: EnvCreator,
        policy_specs: Mapping[str, PolicySpec],
        workers: WorkerSet,
        *,
        parallel: bool = False,
        offline: OfflineData | None = None,
    ) -> None:
        self.interval = config.evaluation_interval or 0
        self.num_episodes = config.evaluation_num_episodes
        self.record_video = config.evaluation_video
        self.parallel = parallel
        self._workers = workers
        self._local: EvaluationWorker | None = None
        self._remote: EvaluationWorkers | None = None
        self._in_flight: int | None = None  # the iteration whose round the evaluation actors play now
        self._video: EvaluationVideo | None = None
        self._restarts_before = 0  # restarts of earlier sessions of a restored run
        self._off_policy: OffPolicyEstimation | None = None
        if not self.interval:
            return
        if offline is not None and config.off_policy_estimation_methods:
            self._off_policy = OffPolicyEstimation(config, offline, workers)
        if self.record_video:
            require_video_dependencies()  # here, before training, not at the first evaluation
        settings = evaluation_settings(config)
        self._seed = settings.seed
        explore = evaluation_explores(config)
        if config.evaluation_num_workers:
            self._remote = EvaluationWorkers(
                env_creator=env_creator,
                policy_specs=policy_specs,
                config=settings,
                num_workers=config.evaluation_num_workers,
                reservation=workers.reservation,
                explore=explore,
            )
        else:
            self._local = EvaluationWorker(
                env_creator=env_creator, policy_specs=policy_specs, config=settings, explore=explore
            )

    def due(self, iteration: int) -> bool:
        """Whether training iteration ``iteration`` (1-based) ends with an evaluation."""
        return bool(self.interval) and iteration % self.interval == 0

    @property
    def num_restarts(self) -> int:
        """Evaluation actors recreated in the whole run (restored sessions included)."""
        return self._restarts_before + (self._remote.num_restarts if self._remote is not None else 0)

    def before_iteration(self, iteration: int, timestep: int) -> None:
        """Call before iteration ``iteration`` trains: a parallel evaluation due then starts now."""
        if self.parallel and self._remote is not None and self.due(iteration):
            self._start(timestep)
            self._in_flight = iteration

    def after_iteration(self, iteration: int, timestep: int) -> dict[str, Any]:
        """Call once iteration ``iteration`` trained: the result keys it adds (none while evaluation is off)."""
        if not self.interval:
            return {}
        keys: dict[str, Any] = {}
        if self.due(iteration):
            output = self._evaluate(iteration, timestep)
            keys[EVALUATION_KEY] = {**summarize_episodes(output.episodes), "episodes": len(output.episodes)}
            if self._off_policy is not None:
                keys[EVALUATION_KEY][ESTIMATES_KEY] = self._off_policy.estimates()
            if output.video is not None:
                self._video = EvaluationVideo(iteration, output.video)
        keys[RESTARTS_KEY] = self.num_restarts
        return keys

    def _evaluate(self, iteration: int, timestep: int) -> EvaluationOutput:
        if self._remote is not None:
            if self._in_flight != iteration:
                self._start(timestep)
            self._in_flight = None
            return self._remote.collect()
        assert self._local is not None
        self._local.set_weights(self._weights(), {"timestep": timestep})
        self._local.set_filter(self._filter_stats())
        return self._local.evaluate(episode_seeds(self._seed, self.num_episodes), self.record_video)

    def _start(self, timestep: int) -> None:
        assert self._remote is not None
        seeds = episode_seeds(self._seed, self.num_episodes)
        self._remote.start(self._weights(), {"timestep": timestep}, seeds, self.record_video, self._filter_stats())

    def _weights(self) -> dict[str, Any]:
        local = self._workers.local_worker()
        with local.lock:  # not halfway through a learner thread's step
            return local.get_weights()

    def _filter_stats(self) -> RunningStats | None:
        """The run's merged observation statistics (None without an observation filter)."""
        obs_filter = self._workers.local_worker().obs_filter
        return None if obs_filter is None else obs_filter.stats()

    def take_video(self) -> EvaluationVideo | None:
        """The video of the latest evaluation not taken yet (only the latest is kept), or None."""
        video, self._video = self._video, None
        return video

    def get_state(self) -> dict[str, Any]:
        """The restart count, for checkpoints."""
        return {RESTARTS_KEY: self.num_restarts}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`get_state`'s output: restarts keep counting the whole run."""
        this_session = self._remote.num_restarts if self._remote is not None else 0
        self._restarts_before = int(state.get(RESTARTS_KEY, 0)) - this_session

    def stop(self) -> None:
        """Kill the evaluation actors."""
        if self._remote is not None:
            self._remote.stop()
