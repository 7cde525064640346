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
from flowrl.policy.policy import Policy, PolicySpec
from flowrl.policy.postprocessing import adjust_nstep, bootstrap_value, compute_advantages, discount_cumsum
from flowrl.policy.torch_policy import TorchPolicy

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
    "LinearSchedule",
    "MLPEncoder",
    "Policy",
    "PolicySpec",
    "SquashedGaussian",
    "StochasticSampling",
    "TorchPolicy",
    "adjust_nstep",
    "bootstrap_value",
    "compute_advantages",
    "discount_cumsum",
    "dist_class_for",
    "model_config",
]
