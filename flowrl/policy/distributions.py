"""Action distributions parameterised by a model's output tensor.

Each class is built from a batch of "distribution inputs" (what the model emits) and
gives samples, log-probabilities, entropies and KL divergences per row.
``dist_class_for(action_space)`` picks the distribution and the number of inputs it needs;
``Categorical(inputs, action_mask=mask)`` gives a batch's illegal actions no probability, and
``Categorical.with_action_mask(mask)`` binds the mask into a one-argument factory (see
:mod:`flowrl.policy.action_masks`).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, ClassVar

import gymnasium as gym
import numpy as np

from flowrl.deferred import F, torch
from flowrl.errors import FlowRLError
from flowrl.policy.action_masks import mask_logits


class ActionDistribution:
    """A batch of action distributions built from ``inputs`` of shape ``[B, num_inputs]``.

    ``action_mask`` (``[B, n]`` bools; None: all actions legal) is taken only by :class:`Categorical`;
    the other distributions raise on one.
    """

    deterministic_only: ClassVar[bool] = False
    #: The legal actions (``[B, n]`` bools) this distribution was built with; None: all are legal.
    action_mask: torch.Tensor | None = None

    @classmethod
    def with_action_mask(cls, mask: torch.Tensor) -> DistFactory:
        """A factory ``inputs -> distribution`` whose distributions give the actions ``mask`` marks illegal
        no probability (``functools.partial(cls, action_mask=mask)``)."""
        raise _unmaskable(cls)

    def __init__(self, inputs: torch.Tensor, action_mask: torch.Tensor | None = None) -> None:
        if action_mask is not None:
            raise _unmaskable(type(self))
        self.inputs = inputs

    def sample(self) -> torch.Tensor:
        """One action per row, drawn at random."""
        raise NotImplementedError

    def deterministic_sample(self) -> torch.Tensor:
        """The most likely action per row."""
        raise NotImplementedError

    def logp(self, actions: torch.Tensor) -> torch.Tensor:
        """Log-probability (density) of ``actions``, shape ``[B]``."""
        raise NotImplementedError

    def entropy(self) -> torch.Tensor:
        """Entropy per row, shape ``[B]``."""
        raise NotImplementedError

    def kl(self, other: "ActionDistribution") -> torch.Tensor:
        """KL(self || other) per row, shape ``[B]``."""
        raise NotImplementedError

    @staticmethod
    def required_inputs(action_space: gym.Space[Any]) -> int:
        """How many model outputs a distribution over ``action_space`` needs."""
        raise NotImplementedError


#: What a loss's ``dist_class`` is: a distribution class, or one with an action mask bound
#: (:meth:`ActionDistribution.with_action_mask`); called with a batch of distribution inputs.
DistFactory = Callable[["torch.Tensor"], ActionDistribution]


def _unmaskable(cls: type[ActionDistribution]) -> FlowRLError:
    return FlowRLError(f"action masks need a Discrete action space (a Categorical distribution), not a {cls.__name__}")


class Categorical(ActionDistribution):
    """A categorical distribution over ``n`` discrete actions, from unnormalised logits (masked first when
    given an ``action_mask``)."""

    def __init__(self, inputs: torch.Tensor, action_mask: torch.Tensor | None = None) -> None:
        if action_mask is not None:
            inputs = mask_logits(inputs, action_mask)
        super().__init__(inputs)
        self.action_mask = action_mask
        self.log_probs = F.log_softmax(inputs, dim=-1)

    def sample(self) -> torch.Tensor:
        # Gumbel-max: one fused pass, cheaper than torch.multinomial for small batches.
        gumbel = -torch.log(-torch.log(torch.rand_like(self.log_probs).clamp_(min=1e-20)))
        return torch.argmax(self.log_probs + gumbel, dim=-1)

    def deterministic_sample(self) -> torch.Tensor:
        return torch.argmax(self.log_probs, dim=-1)

    def logp(self, actions: torch.Tensor) -> torch.Tensor:
        return self.log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> torch.Tensor:
        return -(self.log_probs.exp() * self.log_probs).sum(-1)

    def kl(self, other: ActionDistribution) -> torch.Tensor:
        assert isinstance(other, Categorical)
        return (self.log_probs.exp() * (self.log_probs - other.log_probs)).sum(-1)

    @staticmethod
    def required_inputs(action_space: gym.Space[Any]) -> int:
        assert isinstance(action_space, gym.spaces.Discrete)
        return int(action_space.n)

    @classmethod
    def with_action_mask(cls, mask: torch.Tensor) -> DistFactory:
        return functools.partial(cls, action_mask=mask)


class DiagGaussian(ActionDistribution):
    """A Gaussian with diagonal covariance; inputs are ``[mean, log_std]`` halves."""

    def __init__(self, inputs: torch.Tensor, action_mask: torch.Tensor | None = None) -> None:
        super().__init__(inputs, action_mask)
        self.mean, self.log_std = torch.chunk(inputs, 2, dim=-1)
        self.std = self.log_std.exp()

    def sample(self) -> torch.Tensor:
        return self.mean + self.std * torch.randn_like(self.mean)

    def deterministic_sample(self) -> torch.Tensor:
        return self.mean

    def logp(self, actions: torch.Tensor) -> torch.Tensor:
        z = (actions - self.mean) / self.std
        return -(0.5 * z.pow(2) + self.log_std + 0.5 * math.log(2 * math.pi)).sum(-1)

    def entropy(self) -> torch.Tensor:
        return (self.log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)

    def kl(self, other: ActionDistribution) -> torch.Tensor:
        assert isinstance(other, DiagGaussian)
        return (
            other.log_std
            - self.log_std
            + (self.std.pow(2) + (self.mean - other.mean).pow(2)) / (2.0 * other.std.pow(2))
            - 0.5
        ).sum(-1)

    @staticmethod
    def required_inputs(action_space: gym.Space[Any]) -> int:
        assert isinstance(action_space, gym.spaces.Box)
        return 2 * int(np.prod(action_space.shape))


class Deterministic(ActionDistribution):
    """A point mass: the inputs are the action (DDPG/TD3 actors)."""

    deterministic_only = True

    def sample(self) -> torch.Tensor:
        return self.inputs

    def deterministic_sample(self) -> torch.Tensor:
        return self.inputs

    def logp(self, actions: torch.Tensor) -> torch.Tensor:
        return torch.zeros(actions.shape[0], device=actions.device)

    def entropy(self) -> torch.Tensor:
        return torch.zeros(self.inputs.shape[0], device=self.inputs.device)

    @staticmethod
    def required_inputs(action_space: gym.Space[Any]) -> int:
        assert isinstance(action_space, gym.spaces.Box)
        return int(np.prod(action_space.shape))


class SquashedGaussian(DiagGaussian):
    """A diagonal Gaussian squashed by ``tanh`` into the bounds ``[low, high]`` of a Box.

    Built with :meth:`for_bounds`, which binds the bounds into a subclass so the
    distribution can still be constructed from inputs alone.
    """

    low: ClassVar[torch.Tensor | float] = -1.0
    high: ClassVar[torch.Tensor | float] = 1.0
    _EPS = 1e-6

    @classmethod
    def for_bounds(cls, low: np.ndarray, high: np.ndarray) -> type["SquashedGaussian"]:
        """A subclass squashing into ``[low, high]``."""
        return type(
            "SquashedGaussianBounded",
            (cls,),
            {"low": torch.as_tensor(low, dtype=torch.float32), "high": torch.as_tensor(high, dtype=torch.float32)},
        )

    def __init__(self, inputs: torch.Tensor, action_mask: torch.Tensor | None = None) -> None:
        super().__init__(inputs, action_mask)
        low, high = self.low, self.high
        # torch.clamp takes two tensor bounds or two numbers, never one of each.
        if isinstance(low, torch.Tensor) != isinstance(high, torch.Tensor):
            raise TypeError(
                f"{type(self).__name__} bounds must be both tensors or both numbers, got {low!r} and {high!r}"
            )
        # The class holds tensor bounds on the CPU; a policy on a GPU gives its inputs there, and a CPU tensor of
        # one or more dimensions does not mix with CUDA ones: the bounds move once, with the distribution.
        if isinstance(low, torch.Tensor) and isinstance(high, torch.Tensor):
            low, high = low.to(inputs.device), high.to(inputs.device)
        self._low, self._high = low, high

    def _squash(self, raw: torch.Tensor) -> torch.Tensor:
        low, high = self._low, self._high
        squashed = low + (torch.tanh(raw) + 1.0) * 0.5 * (high - low)
        # float32 rounding can land one ulp outside the bounds when tanh saturates.
        return torch.clamp(squashed, low, high)  # type: ignore[arg-type]  # both tensors or both numbers

    def _unsquash(self, actions: torch.Tensor) -> torch.Tensor:
        unit = 2.0 * (actions - self._low) / (self._high - self._low) - 1.0
        return torch.atanh(unit.clamp(-1.0 + self._EPS, 1.0 - self._EPS))

    def sample(self) -> torch.Tensor:
        return self._squash(super().sample())

    def deterministic_sample(self) -> torch.Tensor:
        return self._squash(self.mean)

    def logp(self, actions: torch.Tensor) -> torch.Tensor:
        raw = self._unsquash(actions)
        # Change of variables: subtract log |d squash / d raw| per dimension.
        log_det = torch.log(0.5 * (self._high - self._low) * (1.0 - torch.tanh(raw).pow(2)) + self._EPS)
        return super().logp(raw) - log_det.sum(-1)

    def entropy(self) -> torch.Tensor:
        raise FlowRLError("SquashedGaussian has no closed-form entropy; estimate it with -logp of samples")

    def kl(self, other: ActionDistribution) -> torch.Tensor:
        raise FlowRLError("SquashedGaussian has no closed-form KL divergence")


def dist_class_for(action_space: gym.Space[Any], kind: str = "auto") -> tuple[type[ActionDistribution], int]:
    """The distribution class for ``action_space`` and the number of model outputs it needs.

    ``kind`` is ``"auto"`` (categorical for Discrete, diagonal Gaussian for Box),
    ``"deterministic"`` or ``"squashed"`` (Box only).
    """
    if isinstance(action_space, gym.spaces.Discrete) and kind == "auto":
        return Categorical, Categorical.required_inputs(action_space)
    if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        if kind == "auto":
            return DiagGaussian, DiagGaussian.required_inputs(action_space)
        if kind == "deterministic":
            return Deterministic, Deterministic.required_inputs(action_space)
        if kind == "squashed":
            return SquashedGaussian.for_bounds(action_space.low, action_space.high), DiagGaussian.required_inputs(
                action_space
            )
    raise FlowRLError(
        f"no action distribution of kind {kind!r} for action space {action_space}; supported: Discrete "
        "(kind 'auto') and 1-D Box (kinds 'auto', 'deterministic', 'squashed')"
    )
