"""A target network: a frozen copy of a model that follows it only when told to (DQN, DDPG, TD3, R2D2)."""

from __future__ import annotations

import copy
from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from flowrl.policy.models import load_module_weights, module_weights


class TargetNetwork:
    """``model`` is a frozen copy of ``source``; :meth:`update` copies ``source`` into it or blends towards it.

    ``version`` counts its changes (updates and loads), so a sender of its weights can tell whether a
    receiver already holds them.
    """

    def __init__(self, source: nn.Module) -> None:
        self.model = copy.deepcopy(source)
        self.model.requires_grad_(False)
        self.version = 0
        # (target, source) tensor lists, made once: loading weights or state copies into these tensors
        # in place, so they stay the modules' own.
        pairs = list(zip(self.model.state_dict().values(), source.state_dict().values()))
        floating = [pair for pair in pairs if pair[0].is_floating_point()]
        others = [pair for pair in pairs if not pair[0].is_floating_point()]
        self._floating = ([t for t, _ in floating], [s for _, s in floating])
        self._others = ([t for t, _ in others], [s for _, s in others])

    def update(self, tau: float = 1.0) -> None:
        """Copy the source (``tau=1``) or move each floating tensor by ``tau`` towards it."""
        (targets, sources), (other_targets, other_sources) = self._floating, self._others
        with torch.no_grad():
            # One foreach kernel for all the floating tensors instead of a Python loop of small ops.
            if tau >= 1.0:
                torch._foreach_copy_(targets, sources)
            else:
                torch._foreach_lerp_(targets, sources, tau)
            if other_targets:  # integer buffers (e.g. batch-norm counts) are copied, never blended
                torch._foreach_copy_(other_targets, other_sources)
        self.version += 1

    def get_weights(self) -> dict[str, np.ndarray]:
        """The target's parameters and buffers as NumPy arrays (copies)."""
        return module_weights(self.model)

    def load(self, weights: Mapping[str, np.ndarray | torch.Tensor]) -> None:
        """Load :meth:`get_weights`'s output (or a ``state_dict``) into the target, in place."""
        load_module_weights(self.model, weights)
        self.version += 1
