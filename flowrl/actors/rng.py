"""The random number generators of a process (Python's, NumPy's global one and PyTorch's), saved and restored.

A checkpoint holds them for the driver and for every remote rollout worker, so that a
resumed run draws the same numbers an uninterrupted one would have.
"""

from __future__ import annotations

import random
from typing import Any, Mapping

import numpy as np

from flowrl.deferred import torch


def process_rng_state() -> dict[str, Any]:
    """This process's RNG states."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_process_rng_state(state: Mapping[str, Any]) -> None:
    """Restore :func:`process_rng_state`'s output in this process."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
