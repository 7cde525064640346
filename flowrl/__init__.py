"""flowrl: distributed reinforcement learning as declarative dataflow execution plans over Ray.

Imports are lazy: ``import flowrl.iterators`` loads neither PyTorch nor Gymnasium, and
``flowrl.Trainer`` and ``flowrl.load_policy`` load them on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowrl._version import __version__
from flowrl.deferred import deferred_attributes

if TYPE_CHECKING:
    from flowrl.engine.trainer import Trainer
    from flowrl.serve.inference import load_policy


__all__ = ["Trainer", "__version__", "load_policy"]

__getattr__ = deferred_attributes(
    __name__, {"flowrl.engine.trainer": ["Trainer"], "flowrl.serve.inference": ["load_policy"]}
)
