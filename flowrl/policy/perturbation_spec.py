"""The policy of the perturbation searches (ES, ARS), declared without PyTorch.

:func:`perturbation_policy_spec` is the :class:`~flowrl.policy.PolicySpec` of a TorchPolicy over a
:class:`~flowrl.policy.perturbable.PerturbableModel` (built when the policy is), and
:func:`num_perturbed_parameters` the length of that model's flat parameter vector, which the
noise table must cover, read from the spec alone.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from flowrl.errors import FlowRLError
from flowrl.policy.distributions import dist_class_for
from flowrl.policy.model_options import model_config
from flowrl.policy.policy import PolicyConfig, PolicySpec
from flowrl.policy.torch_policy import TorchPolicy

if TYPE_CHECKING:
    import torch
    from torch import nn

    from flowrl.policy.perturbable import PerturbableModel


def build_perturbable_model(
    obs_space: gym.Space[Any],
    action_space: gym.Space[Any],
    num_outputs: int,
    config: Mapping[str, Any],
    *,
    zero_init: bool = False,
) -> PerturbableModel:
    """A :class:`~flowrl.policy.perturbable.PerturbableModel` for a flat Box observation space (the
    ``make_model`` of TorchPolicy)."""
    from flowrl.policy.perturbable import PerturbableModel  # the torch module

    return PerturbableModel(
        _obs_dim(obs_space), num_outputs, config["fcnet_hiddens"], config["fcnet_activation"], zero_init
    )


def no_loss(
    policy: TorchPolicy[Any], model: nn.Module, dist_class: Any, batch: Any
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss function of ES/ARS policies: there is none, they learn from perturbation returns."""
    raise FlowRLError("ES and ARS policies learn from the returns of perturbed rollouts, not from sample batches")


def perturbation_policy_spec(
    obs_space: gym.Space[Any],
    action_space: gym.Space[Any],
    config: PolicyConfig,
    make_optimizer: Callable[[TorchPolicy[Any]], torch.optim.Optimizer],
    *,
    zero_init: bool = False,
) -> PolicySpec:
    """A TorchPolicy over a PerturbableModel with deterministic actions (argmax, or the output for Box)."""
    if not isinstance(action_space, (gym.spaces.Discrete, gym.spaces.Box)):
        raise FlowRLError(f"ES and ARS support Discrete and 1-D Box action spaces, got {action_space}")
    kwargs = {
        "loss_fn": no_loss,
        "make_model": functools.partial(build_perturbable_model, zero_init=zero_init),
        "model_interface": None,  # perturbations need the PerturbableModel's layout
        "make_optimizer": make_optimizer,
        "dist_kind": "deterministic" if isinstance(action_space, gym.spaces.Box) else "auto",
    }
    return PolicySpec(TorchPolicy, obs_space, action_space, config, kwargs)


def num_perturbed_parameters(spec: PolicySpec) -> int:
    """The number of parameters of the PerturbableModel ``spec`` builds: an MLP's weights and biases,
    observations in, the action distribution's inputs out."""
    _, num_outputs = dist_class_for(spec.action_space, spec.kwargs.get("dist_kind", "auto"))
    sizes = [_obs_dim(spec.observation_space), *model_config(spec.config.model)["fcnet_hiddens"], num_outputs]
    return sum((fan_in + 1) * fan_out for fan_in, fan_out in zip(sizes, sizes[1:]))


def _obs_dim(obs_space: gym.Space[Any]) -> int:
    if not isinstance(obs_space, gym.spaces.Box):
        raise FlowRLError(f"ES and ARS need a Box observation space, got {obs_space}")
    return int(np.prod(obs_space.shape))
