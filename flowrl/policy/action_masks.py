"""Action masks in acting and learning: illegal actions get no probability, no Q-value maximum, no
random pick (the masks themselves: :mod:`flowrl.envs.flatten`).

Masked entries take the lowest finite float, not ``-inf``: a softmax gives them probability 0, while
entropies, KL divergences and their gradients stay finite (``0 * -inf`` would be NaN), and a row with
no legal action at all stays a uniform distribution instead of NaN.
"""

from __future__ import annotations

import numpy as np

from flowrl.deferred import torch


def mask_logits(inputs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``inputs`` (``[..., n]`` logits or Q-values) with the entries ``mask`` marks illegal (False or 0) at the
    lowest finite float; ``mask`` has as many elements (reshaped to ``inputs``' shape)."""
    legal = mask.reshape(inputs.shape).bool()
    return torch.where(legal, inputs, torch.finfo(inputs.dtype).min)


def mask_logits_numpy(inputs: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """:func:`mask_logits` for NumPy arrays."""
    return np.where(np.asarray(mask, dtype=bool), inputs, np.asarray(np.finfo(inputs.dtype).min, inputs.dtype))


def masked_bootstrap_q(
    next_target: torch.Tensor, next_online: torch.Tensor | None, next_mask: torch.Tensor | None
) -> torch.Tensor:
    """The bootstrapped value of each next state: the target network's Q-value of the best legal action,
    chosen by the online network's Q-values (double Q-learning) or, with ``next_online`` None, by the
    target's own (its max). ``next_mask`` (None: all legal) bounds the choice; a state with no legal
    action is worth 0."""
    chooser = next_target if next_online is None else next_online
    if next_mask is not None:
        chooser = mask_logits(chooser, next_mask)
    best = chooser.argmax(dim=1, keepdim=True)
    values = next_target.gather(1, best).squeeze(1)
    if next_mask is None:
        return values
    return torch.where(next_mask.bool().any(dim=1), values, torch.zeros_like(values))


def random_legal_actions(mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One action per row of ``mask`` (``[B, n]``; nonzero: legal), uniform over the row's legal actions
    (action 0 where none is legal)."""
    scores = rng.random(mask.shape)
    scores[~np.asarray(mask, dtype=bool)] = -1.0
    actions: np.ndarray = scores.argmax(axis=1)
    return actions
