"""flowrl: distributed reinforcement learning as declarative dataflow execution plans over Ray."""

__version__ = "0.1.0"
