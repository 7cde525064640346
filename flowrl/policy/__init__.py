"""Policies: the Policy API, TorchPolicy, models, action distributions, exploration, postprocessing.

Each name is imported from its module on first use (:func:`~flowrl.deferred.deferred_attributes`):
the package itself loads no PyTorch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowrl.deferred import deferred_attributes

if TYPE_CHECKING:
    from flowrl.policy.distributions import (
        ActionDistribution,
        Categorical,
        Deterministic,
        DiagGaussian,
        SquashedGaussian,
        dist_class_for,
    )
    from flowrl.policy.exploration import EpsilonGreedy, Exploration, GaussianNoise, LinearSchedule, StochasticSampling
    from flowrl.policy.model_options import model_config
    from flowrl.policy.models import ActorCriticModel, CNNEncoder, MLPEncoder
    from flowrl.policy.policy import LearnOutput, LearnTimes, Policy, PolicyConfig, PolicySpec
    from flowrl.policy.postprocessing import (
        actor_critic_postprocess,
        adjust_nstep,
        bootstrap_value,
        compute_advantages,
        discount_cumsum,
        nstep_postprocess,
    )
    from flowrl.policy.torch_hooks import LossOutput
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
    "LearnOutput",
    "LearnTimes",
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

__getattr__ = deferred_attributes(
    __name__,
    {
        "flowrl.policy.distributions": [
            "ActionDistribution",
            "Categorical",
            "Deterministic",
            "DiagGaussian",
            "SquashedGaussian",
            "dist_class_for",
        ],
        "flowrl.policy.exploration": [
            "EpsilonGreedy",
            "Exploration",
            "GaussianNoise",
            "LinearSchedule",
            "StochasticSampling",
        ],
        "flowrl.policy.model_options": ["model_config"],
        "flowrl.policy.models": ["ActorCriticModel", "CNNEncoder", "MLPEncoder"],
        "flowrl.policy.policy": ["LearnOutput", "LearnTimes", "Policy", "PolicyConfig", "PolicySpec"],
        "flowrl.policy.postprocessing": [
            "actor_critic_postprocess",
            "adjust_nstep",
            "bootstrap_value",
            "compute_advantages",
            "discount_cumsum",
            "nstep_postprocess",
        ],
        "flowrl.policy.torch_hooks": ["LossOutput"],
        "flowrl.policy.torch_policy": ["TorchPolicy"],
    },
)
