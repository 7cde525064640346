"""Policies: the Policy API, TorchPolicy, models, action distributions, exploration, postprocessing."""

from flowrl.policy.distributions import (
    ActionDistribution,
    Categorical,
    Deterministic,
    DiagGaussian,
    SquashedGaussian,
    dist_class_for,
)
from flowrl.policy.exploration import EpsilonGreedy, Exploration, GaussianNoise, LinearSchedule, StochasticSampling
from flowrl.policy.models import ActorCriticModel, CNNEncoder, MLPEncoder, model_config
from flowrl.policy.policy import LearnOutput, Policy, PolicyConfig, PolicySpec
from flowrl.policy.postprocessing import (
    actor_critic_postprocess,
    adjust_nstep,
    bootstrap_value,
    compute_advantages,
    discount_cumsum,
    nstep_postprocess,
)
from flowrl.policy.torch_policy import LossOutput, TorchPolicy

__all__ = [
    "ActionDistribution",
    "ActorCriticModel",
    "CNNEncoder",
    "Categorical",
    "Deterministic",
    "DiagGaussian",
    "EpsilonGreedy",
    "Exploration",
    "GaussianNoise",
    "LearnOutput",
    "LinearSchedule",
    "LossOutput",
    "MLPEncoder",
    "Policy",
    "PolicyConfig",
    "PolicySpec",
    "SquashedGaussian",
    "StochasticSampling",
    "TorchPolicy",
    "actor_critic_postprocess",
    "adjust_nstep",
    "bootstrap_value",
    "compute_advantages",
    "discount_cumsum",
    "dist_class_for",
    "model_config",
    "nstep_postprocess",
]
