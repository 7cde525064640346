"""What an algorithm hands a :class:`~flowrl.policy.TorchPolicy`: the signatures of its loss, postprocessing,
model, optimizer and TD-error functions, and what a loss returns."""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple

import gymnasium as gym

from flowrl.data import SampleBatch
from flowrl.deferred import nn, torch
from flowrl.policy.distributions import DistFactory

TensorBatch = dict[str, "torch.Tensor"]


class LossOutput(NamedTuple):
    """What a loss function returns: the loss to minimise, scalar statistics to report, and
    optionally per-row TD errors (the typed extra that replay priorities are made from)."""

    loss: torch.Tensor
    stats: dict[str, float]
    td_error: torch.Tensor | None = None


# The first argument of each is the TorchPolicy (typed Any here: this module sits below torch_policy).
# A loss may return a plain ``(loss, stats)`` tuple too.
LossFn = Callable[[Any, "nn.Module", DistFactory, TensorBatch], "LossOutput | tuple[torch.Tensor, dict[str, float]]"]
PostprocessFn = Callable[[Any, SampleBatch], SampleBatch]
ModelFn = Callable[[gym.Space[Any], gym.Space[Any], int, Mapping[str, Any]], "nn.Module"]
OptimizerFn = Callable[[Any], "torch.optim.Optimizer"]
GradientSync = Callable[["nn.Module", int, bool], bool]
#: ``td_error_fn(policy, batch)``: the TD error of each row of a postprocessed batch (its tensors) with the
#: policy's current model and target network, as its loss computes it, without side effects (no counters
#: moved, no gradient): the worker-side priorities of the rows (``worker_side_prioritization``).
TDErrorFn = Callable[[Any, TensorBatch], "torch.Tensor"]
