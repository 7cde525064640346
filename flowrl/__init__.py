"""flowrl: distributed reinforcement learning as declarative dataflow execution plans over Ray.

Imports are lazy: ``import flowrl.iterators`` loads neither PyTorch nor Gymnasium, and
``flowrl.Trainer`` and ``flowrl.load_policy`` load them on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowrl.deferred import deferred_attributes

if TYPE_CHECKING:
    from flowrl.inference import load_policy
    from flowrl.trainer import Trainer

__version__ = "0.1.0"

__all__ = ["Trainer", "__version__", "load_policy"]

__getattr__ = deferred_attributes(__name__, {"flowrl.trainer": ["Trainer"], "flowrl.inference": ["load_policy"]})
