"""Starting or joining Ray the way flowrl's entry points need it."""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator

from flowrl.deferred import ray
from flowrl.errors import ClusterConnectionError


def start_ray(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Make sure Ray is running in this process; return True if this call started it.

    With no ``address`` (and no ``RAY_ADDRESS`` in the environment) an embedded local
    instance is started (dashboard off, only errors logged, Ray's token authentication on).
    With an address, the existing cluster is joined; one that cannot be reached, or whose
    token authentication refuses this driver, raises :class:`~flowrl.errors.ClusterConnectionError`.
    If Ray is already initialised it is used as is (returns False).
    """
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        # Ray turns its token authentication on for a local instance unless RAY_AUTH_MODE says otherwise.
        # "local": a new instance, even where `ray start` left a cluster that ray.init() would join by default.
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, logging_level=logging.ERROR)
        return True
    try:
        ray.init(address=address, logging_level=logging.ERROR)
    except (ConnectionError, ray.exceptions.AuthenticationError) as e:
        raise ClusterConnectionError(
            f"cannot join the Ray cluster at {address!r}: {str(e).strip().splitlines()[0]}. Check the address "
            "(ray status on the head node prints it); a cluster with token authentication (RAY_AUTH_MODE=token) "
            "needs its token here too, in RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token"
        ) from e
    return True


def stop_ray(started_here: bool) -> None:
    """Disconnect from Ray if :func:`start_ray` started it (a joined cluster keeps running:
    ``ray.shutdown`` only disconnects this driver from a cluster it did not start)."""
    if started_here and ray.is_initialized():
        ray.shutdown()


@contextlib.contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None) -> Iterator[None]:
    """Use Ray for the duration of the block (see :func:`start_ray`)."""
    started = start_ray(address, num_cpus)
    try:
        yield
    finally:
        stop_ray(started)
