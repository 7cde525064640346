"""Off-policy estimation at an offline run's evaluations (``off_policy_estimation_methods``).

When the run starts, the first :data:`MAX_EPISODES` whole episodes of its ``input`` are read once and
checked (they must carry ``action_logp`` for every estimator but ``dm``); at each evaluation the current
policy's value on them is estimated (:mod:`flowrl.policy.off_policy_estimation`) and reported as::

    result["evaluation"]["off_policy_estimation"] = {"wis": {"v_behavior": ..., "v_target": ...,
                                                             "v_gain": ..., "v_target_std_error": ...}, ...}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import gymnasium as gym

from flowrl.actors import WorkerSet
from flowrl.config import TrainerConfig
from flowrl.data import DEFAULT_POLICY_ID, SampleBatch
from flowrl.errors import ConfigError, OfflineDataError
from flowrl.policy.off_policy_estimation import Q_METHODS, off_policy_estimates, whole_episodes

if TYPE_CHECKING:
    from flowrl.data.offline import OfflineData
    from flowrl.policy import TorchPolicy

#: The key of the evaluation's results holding the estimates.
ESTIMATES_KEY = "off_policy_estimation"
#: Whole episodes read from the start of the input to estimate on.
MAX_EPISODES = 200
_COLUMNS = [
    SampleBatch.OBS,
    SampleBatch.ACTIONS,
    SampleBatch.REWARDS,
    SampleBatch.TERMINATEDS,
    SampleBatch.TRUNCATEDS,
    SampleBatch.EPS_ID,
    SampleBatch.T,
]


class OffPolicyEstimation:
    """The estimators ``config`` names, run on ``data``'s first whole episodes with the policy of ``workers``'
    local worker. Raises :class:`~flowrl.errors.OfflineDataError` for data the estimators cannot use, and
    :class:`~flowrl.errors.ConfigError` for estimators the policy's action space rules out."""

    def __init__(self, config: TrainerConfig, data: OfflineData, workers: WorkerSet) -> None:
        self.methods = list(config.off_policy_estimation_methods)
        self.gamma = config.gamma
        self.seed = config.seed
        self._workers = workers
        spec = workers.policy_specs[DEFAULT_POLICY_ID]
        fitted = [m for m in self.methods if m in Q_METHODS]
        if fitted and not isinstance(spec.action_space, gym.spaces.Discrete):
            raise ConfigError(
                [
                    f"off_policy_estimation_methods: {fitted} fit a Q-function over discrete actions, but the "
                    f"action space is {spec.action_space}; is and wis estimate any action space"
                ]
            )
        if workers.local_worker().get_policy(DEFAULT_POLICY_ID).is_recurrent:
            raise ConfigError(["off_policy_estimation_methods: the estimators evaluate feed-forward policies only"])
        data.require(_COLUMNS, "off-policy estimation evaluates the policy on whole recorded episodes")
        weighing = [m for m in self.methods if m != "dm"]
        if weighing and SampleBatch.ACTION_LOGP not in data.schema.names:
            raise OfflineDataError(
                f"input {data.describe()!r} lacks action_logp, which {weighing} need: the recording policy's "
                "log-probability of each action weighs it against the trained policy's; record with output: DIR "
                "or flowrl record (they write it), or estimate with dm only"
            )
        columns = _COLUMNS + ([SampleBatch.ACTION_LOGP] if weighing else [])
        episodes = whole_episodes(data.iter_batches(4096, columns), MAX_EPISODES)
        if episodes is None:
            raise OfflineDataError(
                f"input {data.describe()!r} holds no whole episode (rows from t=0 to a terminated or truncated "
                "step) to estimate the policy's value on"
            )
        self.episodes = episodes

    def estimates(self) -> dict[str, Any]:
        """Each estimator's figures for the local worker's current policy."""
        local = self._workers.local_worker()
        with local.lock:  # not halfway through a learner thread's step
            policy = cast("TorchPolicy[Any]", local.get_policy(DEFAULT_POLICY_ID))  # offline algorithms train these
            return off_policy_estimates(policy, self.episodes, self.methods, self.gamma, seed=self.seed)
