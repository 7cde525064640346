"""Starting or joining Ray the way flowrl's entry points need it."""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator

import ray


@contextlib.contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None) -> Iterator[None]:
    """Use Ray for the duration of the block.

    With no ``address`` (and no ``RAY_ADDRESS`` in the environment) an embedded local
    instance is started (dashboard off, quiet logs) and shut down afterwards. With an
    address, the existing cluster is joined and left running. If Ray is already
    initialised in this process, it is used as is and left alone.
    """
    if ray.is_initialized():
        yield
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=True)
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level=logging.WARNING)
    try:
        yield
    finally:
        ray.shutdown()
