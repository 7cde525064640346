"""State leaving a policy's device: copies on the CPU, so that what a policy on a GPU saves (optimizer
moments, target networks) unpickles on a machine without one, and later steps leave the copy be."""

from __future__ import annotations

import copy
from typing import Any

from flowrl.deferred import torch


def cpu_copy(value: Any) -> Any:
    """A deep copy of ``value`` (a ``state_dict``: nested dicts, lists and tuples) with every tensor on the CPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: cpu_copy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(cpu_copy(item) for item in value)
    return copy.deepcopy(value)
