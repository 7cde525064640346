"""State leaving a policy's device: on the CPU, so that what a policy on a GPU saves (optimizer moments, target
networks) unpickles on a machine without one; as copies where later steps must leave the saved state be."""

from __future__ import annotations

import copy as copying
from typing import Any

from flowrl.deferred import torch


def on_cpu(value: Any, *, copy: bool = True) -> Any:
    """``value`` (a ``state_dict``: nested dicts, lists and tuples) with every tensor on the CPU, as a deep copy;
    with ``copy=False`` the CPU tensors themselves stay (for state serialized at once, such as an actor's reply)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=copy)
    if isinstance(value, dict):
        return {key: on_cpu(item, copy=copy) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(on_cpu(item, copy=copy) for item in value)
    return copying.deepcopy(value) if copy else value
