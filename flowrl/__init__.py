"""flowrl: distributed reinforcement learning as declarative dataflow execution plans over Ray."""

from flowrl.trainer import Trainer

__version__ = "0.1.0"

__all__ = ["Trainer", "__version__"]
