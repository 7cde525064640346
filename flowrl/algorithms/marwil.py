"""MARWIL (monotonic advantage re-weighted imitation learning) and behaviour cloning, from offline experiences.

Plan: ReadOffline (rows in file order, returns computed per episode piece, shuffled) -> TrainOneStep -> metrics;
the rollout workers' envs only evaluate. MARWIL (Wang et al. 2018) imitates the data's actions weighted by
``exp(beta * advantage / scale)``, where the advantage is the discounted return minus a learned value and
``scale`` a moving root mean square of the advantages; ``beta = 0`` is behaviour cloning (``bc``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym

from flowrl.actors import PlanResources, WorkerSet
from flowrl.actors.offline_input import offline_resources
from flowrl.algorithms.registry import Algorithm
from flowrl.config import TrainerConfig, cfg_field
from flowrl.config.data_keys import offline_only_problems
from flowrl.data import SampleBatch
from flowrl.deferred import nn, torch
from flowrl.iterators import LocalIterator
from flowrl.operators import ReadOffline, StandardMetricsReporting, TrainOneStep
from flowrl.policy import LossOutput, PolicySpec, TorchPolicy
from flowrl.policy.distributions import DistFactory
from flowrl.policy.postprocessing import returns_postprocess

#: The policy coefficient holding the moving mean of squared advantages (saved in checkpoints).
SQD_ADV_NORM = "moving_average_sqd_adv_norm"
#: The largest weight a row's action gets (advantage-weighted regression's clip, Peng et al. 2019).
MAX_WEIGHT = 20.0


@dataclass(kw_only=True)
class MARWILConfig(TrainerConfig):
    """MARWIL settings (shared keys: see :class:`~flowrl.config.TrainerConfig`); ``input`` names the experiences."""

    #: The name errors give the algorithm by.
    algorithm_name: ClassVar[str] = "marwil"

    defaults = {
        "num_workers": 0,
        "train_batch_size": 512,
        "lr": 1e-3,
        "timesteps_per_iteration": 100_000,
        "evaluation_interval": 1,
        "evaluation_num_episodes": 10,
    }
    # RLlib 1.13's MARWIL (rllib/agents/marwil/marwil.py; 2.0-2.2 the same values).
    rllib_defaults = {"lr": 1e-4, "train_batch_size": 2000}

    beta: float = cfg_field(
        1.0, "How strongly advantages weight the imitation (0: behaviour cloning, every action alike).", min=0
    )
    vf_coeff: float = cfg_field(1.0, "Weight of the value-function loss (unused when beta is 0).", min=0)
    moving_average_sqd_adv_norm_start: float = cfg_field(
        100.0, "Starting value of the moving mean of squared advantages that scales them.", min=0, min_exclusive=True
    )
    moving_average_sqd_adv_norm_update_rate: float = cfg_field(
        1e-8, "How fast the moving mean of squared advantages follows each batch's.", min=0, max=1
    )

    def check(self) -> list[str]:
        return super().check() + offline_only_problems(self.input, self.algorithm_name)


@dataclass(kw_only=True)
class BCConfig(MARWILConfig):
    """Behaviour cloning: MARWIL with ``beta = 0``, every recorded action imitated alike."""

    algorithm_name: ClassVar[str] = "bc"
    # RLlib 1.13's BC (rllib/agents/marwil/bc.py): MARWIL's with beta 0.
    rllib_defaults = {"lr": 1e-4, "train_batch_size": 2000}
    beta: float = cfg_field(
        0.0, "0 for behaviour cloning; a positive beta weights actions by advantage (MARWIL).", min=0
    )


def marwil_loss(
    policy: TorchPolicy[MARWILConfig],
    model: nn.Module,
    dist_class: DistFactory,
    batch: dict[str, torch.Tensor],
) -> LossOutput:
    """``-mean(w * log pi(a|s)) + vf_coeff * 0.5 * mean(A**2)`` with ``A = return - V(s)`` and
    ``w = min(exp(beta * A / sqrt(m)), 20)``, ``m`` the moving mean of ``A**2``; ``w = 1`` when beta is 0."""
    config = policy.config
    logits, values = policy.model_outputs(model, batch)
    logp = dist_class(logits).logp(batch[SampleBatch.ACTIONS])
    stats: dict[str, float] = {}
    if config.beta:
        assert values is not None, "MARWIL's models have a value head"
        advantages = batch[SampleBatch.VALUE_TARGETS] - values
        squared = advantages.pow(2).mean()
        norm = policy.coeffs[SQD_ADV_NORM]
        norm += config.moving_average_sqd_adv_norm_update_rate * (float(squared.detach()) - norm)
        policy.coeffs[SQD_ADV_NORM] = norm
        weights = torch.clamp(torch.exp(config.beta * advantages.detach() / (1e-8 + norm**0.5)), max=MAX_WEIGHT)
        vf_loss = 0.5 * squared
        policy_loss = -(weights * logp).mean()
        loss = policy_loss + config.vf_coeff * vf_loss
        stats.update(vf_loss=float(vf_loss.detach()), mean_weight=float(weights.mean()), **{SQD_ADV_NORM: norm})
    else:
        policy_loss = -logp.mean()
        loss = policy_loss
    stats["policy_loss"] = float(policy_loss.detach())
    return LossOutput(loss, stats)


def make_marwil_policy(obs_space: gym.Space[Any], action_space: gym.Space[Any], config: MARWILConfig) -> PolicySpec:
    """A TorchPolicy (actor and value heads) with the MARWIL loss; offline rows get their returns as value targets."""
    kwargs = {
        "loss_fn": marwil_loss,
        "postprocess_fn": returns_postprocess if config.beta else None,
        "coeffs": {SQD_ADV_NORM: config.moving_average_sqd_adv_norm_start},
    }
    return PolicySpec(TorchPolicy, obs_space, action_space, config, kwargs)


def columns_needed(config: MARWILConfig) -> tuple[list[str], str]:
    """The columns the loss reads from the experiences, and why."""
    if config.beta:
        columns = [SampleBatch.OBS, SampleBatch.ACTIONS, SampleBatch.REWARDS, SampleBatch.NEW_OBS]
        return [*columns, SampleBatch.TERMINATEDS], "MARWIL weights actions by returns (beta > 0)"
    return [SampleBatch.OBS, SampleBatch.ACTIONS], "behaviour cloning imitates (observation, action) pairs"


def make_resources(workers: WorkerSet, config: MARWILConfig) -> PlanResources:
    """The experiences of ``input``, opened and checked against the run, and the learner group the config asks for."""
    columns, why = columns_needed(config)
    return offline_resources(workers, config, algorithm=config.algorithm_name, columns=columns, why=why)


def execution_plan(workers: WorkerSet, config: MARWILConfig, resources: PlanResources) -> LocalIterator[dict[str, Any]]:
    """ReadOffline (episode returns, shuffled batches) -> TrainOneStep -> metrics (evaluation plays the envs)."""
    batches = ReadOffline(resources.offline, workers, config)
    train = batches.for_each(TrainOneStep(workers, resources=resources))
    return StandardMetricsReporting(train, workers, config)


ALGORITHM = Algorithm(
    "marwil",
    "MARWIL: advantage-weighted imitation of offline experiences",
    MARWILConfig,
    make_marwil_policy,
    execution_plan,
    make_resources=make_resources,
    live_keys=frozenset({"lr", "beta"}),
    learner_group=True,
    offline=True,
)
BC = Algorithm(
    "bc",
    "behaviour cloning of offline experiences",
    BCConfig,
    make_marwil_policy,
    execution_plan,
    make_resources=make_resources,
    live_keys=frozenset({"lr"}),
    learner_group=True,
    offline=True,
)
