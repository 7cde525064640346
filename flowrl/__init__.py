"""flowrl: distributed reinforcement learning as declarative dataflow execution plans over Ray.

Imports are lazy: ``import flowrl.iterators`` loads neither PyTorch nor Gymnasium, and
``flowrl.Trainer`` and ``flowrl.load_policy`` load them on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flowrl.inference import load_policy
    from flowrl.trainer import Trainer

__version__ = "0.1.0"

__all__ = ["Trainer", "__version__", "load_policy"]

# Public name -> module that defines it, imported when the name is first used.
_LAZY = {"Trainer": "flowrl.trainer", "load_policy": "flowrl.inference"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'flowrl' has no attribute {name!r}")
