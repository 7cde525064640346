"""A custom model that is recurrent itself, adapted to what flowrl's recurrent policies run.

A ``model.custom_model`` class is recurrent when it declares its initial state (see
:mod:`flowrl.policy.custom_model`)::

    class MyGRU(nn.Module):
        def __init__(self, obs_space, action_space, num_outputs, **custom_model_config): ...
        def get_initial_state(self) -> list[torch.Tensor]: ...   # one env's state, each entry [size]
        def forward(self, obs, state): ...
            # obs [B, T, obs_dim], state: one [B, size] tensor per entry
            # -> (dist_inputs [B, T, num_outputs], values [B, T], next state: one [B, size] per entry)

:class:`RecurrentCustomModel` wraps it with the methods :class:`~flowrl.policy.TorchPolicy` calls on a
recurrent model (as on :class:`~flowrl.policy.recurrent.RecurrentActorCritic`): ``initial_state``,
``forward_sequences``, and what :class:`~flowrl.policy.recurrent.SequenceModel` builds on them (one ``step``
per acting call, ``forward_rows`` over a batch cut into sequences, padded, its padding left out). Its
``[B, T, ...]`` forward is checked once, when it is built.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from flowrl.policy.recurrent import SequenceModel


class RecurrentCustomModel(SequenceModel):
    """A user's recurrent module (``forward(obs, state) -> (dist_inputs, values, state)`` over ``[B, T]``)
    as a recurrent policy's model. The previous actions and rewards the samplers record are not given to it."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        declared: Any = getattr(module, "get_initial_state")()  # the user's method (nn.Module types it a tensor)
        self._initial = [np.asarray(torch.as_tensor(s).detach().cpu(), dtype=np.float32) for s in declared]

    def initial_state(self) -> list[np.ndarray]:
        """One env's state at an episode's start, as the module declared it."""
        return [s.copy() for s in self._initial]

    def forward_sequences(
        self,
        obs: torch.Tensor,
        state: list[torch.Tensor],
        prev_actions: torch.Tensor | None = None,
        prev_rewards: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """The module's forward over ``[B, T, ...]`` observations from ``state``."""
        dist_inputs, values, state_out = self.module(obs, list(state))
        return dist_inputs, values, list(state_out)


def sequence_problem(model: RecurrentCustomModel, obs: torch.Tensor, num_outputs: int) -> str | None:
    """What is wrong with ``model``'s outputs for ``obs`` (``[B, T, ...]``, probe observations) from its initial
    state, or None."""
    B, T = obs.shape[:2]
    initial = model.initial_state()
    if not initial or any(s.ndim != 1 for s in initial):
        return f"get_initial_state() returned {[list(s.shape) for s in initial]}: a non-empty list of 1-d entries"
    state = [torch.as_tensor(np.repeat(s[None], B, axis=0)) for s in initial]
    try:
        out = model.module(obs, state)
    except Exception as e:  # noqa: BLE001 - whatever the user's forward raises is the answer
        return f"forward(obs, state) raised {type(e).__name__}: {e}"
    if not (isinstance(out, (tuple, list)) and len(out) == 3):
        return f"forward(obs, state) returned {type(out).__name__}, not (dist_inputs, values, state)"
    dist_inputs, values, state_out = out
    if not (isinstance(dist_inputs, torch.Tensor) and tuple(dist_inputs.shape) == (B, T, num_outputs)):
        return f"for [B, T] = [{B}, {T}], its dist_inputs are {_shape(dist_inputs)}, not [{B}, {T}, {num_outputs}]"
    if not (isinstance(values, torch.Tensor) and tuple(values.shape) == (B, T)):
        return f"for [B, T] = [{B}, {T}], its values are {_shape(values)}, not [{B}, {T}]"
    want = [[B, *s.shape] for s in initial]
    got = [_shape(s) for s in state_out] if isinstance(state_out, (tuple, list)) else [_shape(state_out)]
    if got != [str(w) for w in want]:
        return f"its next state is {got}, not the state's shapes {want}"
    return None


def _shape(value: Any) -> str:
    return str(list(value.shape)) if isinstance(value, torch.Tensor) else f"a {type(value).__name__}"
