"""Starting or joining Ray the way flowrl's entry points need it.

A single-machine run's Ray listens on the loopback interface only, and a token file Ray creates
for it is readable by its owner only; joining a cluster of another Ray or Python version is a
:class:`~flowrl.errors.ClusterConnectionError` naming both.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
import warnings
from pathlib import Path
from typing import Iterator

from flowrl.deferred import ray
from flowrl.errors import ClusterConnectionError, RunWarning

# Where Ray keeps the token it creates for a local instance with token authentication
# (ray._private.authentication.authentication_token_setup._get_default_token_path).
_TOKEN_PATH = Path(".ray") / "auth_token"
# What ray._private.utils.check_version_info raises (a RuntimeError) when this process's Ray or
# Python differs from the cluster's: "Version mismatch: The cluster was started with:\n    Ray: X\n
# Python: Y\nThis process on ... was started with:\n    Ray: X'\n    Python: Y'\n".
_VERSION_MISMATCH = re.compile(
    r"Version mismatch:.*?Ray: (?P<cluster_ray>\S+)\s+Python: (?P<cluster_python>\S+)"
    r".*?Ray: (?P<ray>\S+)\s+Python: (?P<python>\S+)",
    re.DOTALL,
)


def start_ray(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Make sure Ray is running in this process; return True if this call started it.

    With no ``address`` (and no ``RAY_ADDRESS`` in the environment) an embedded local
    instance is started (dashboard off, only errors logged, Ray's token authentication on),
    listening on 127.0.0.1 only; a token file Ray creates for it is made readable by its
    owner only, and one that was there already and that others can read is warned about.
    With an address, the existing cluster is joined; one that cannot be reached, whose token
    authentication refuses this driver, or that runs another Ray or Python version, raises
    :class:`~flowrl.errors.ClusterConnectionError`.
    If Ray is already initialised it is used as is (returns False).
    """
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    token = Path.home() / _TOKEN_PATH
    token_existed = token.exists()
    if token_existed:
        _warn_if_readable_by_others(token)
    if not address:
        # Ray turns its token authentication on for a local instance unless RAY_AUTH_MODE says otherwise.
        # "local": a new instance, even where `ray start` left a cluster that ray.init() would join by default.
        with _loopback_only():
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, logging_level=logging.ERROR)
        if not token_existed and token.exists():
            token.chmod(0o600)
        return True
    try:
        ray.init(address=address, logging_level=logging.ERROR)
    except (ConnectionError, ray.exceptions.AuthenticationError) as e:
        raise ClusterConnectionError(
            f"cannot join the Ray cluster at {address!r}: {str(e).strip().splitlines()[0]}. Check the address "
            "(ray status on the head node prints it); a cluster with token authentication (RAY_AUTH_MODE=token) "
            "needs its token here too, in RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token"
        ) from e
    except RuntimeError as e:
        mismatch = _VERSION_MISMATCH.search(str(e))
        if mismatch is None:
            raise
        raise ClusterConnectionError(
            f"cannot join the Ray cluster at {address!r}: it runs Ray {mismatch['cluster_ray']} on Python "
            f"{mismatch['cluster_python']}, this process Ray {mismatch['ray']} on Python {mismatch['python']}. "
            "Every node and driver of a cluster needs the same Ray and Python versions: install the cluster's here"
        ) from e
    return True


@contextlib.contextmanager
def _loopback_only() -> Iterator[None]:
    """Within the block, a Ray instance started here and its processes listen on 127.0.0.1 only.

    Ray's switch (``ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR``, read once at import into
    ``ray_constants.ENABLE_RAY_CLUSTER``) for nodes that other machines can reach: off, a node's
    address is 127.0.0.1 and its GCS, raylet, workers, agents and metrics servers listen on loopback
    only (Ray's own default on macOS and Windows). A Ray without the constant gets the env var only.
    """
    from ray._private import ray_constants  # the switch, as this process already read it

    switch = ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR
    previous_env = os.environ.get(switch)
    previous = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    os.environ[switch] = "0"  # for the processes Ray starts, which read it themselves
    if previous is not None:
        ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if previous is not None:
            ray_constants.ENABLE_RAY_CLUSTER = previous
        if previous_env is None:
            os.environ.pop(switch, None)
        else:
            os.environ[switch] = previous_env


def _warn_if_readable_by_others(token: Path) -> None:
    """Warn about a token file (not flowrl's to change) that users other than its owner can read."""
    try:
        mode = token.stat().st_mode
    except OSError:
        return
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        warnings.warn(
            f"Ray's token file {token} can be read by other users (mode {stat.S_IMODE(mode):o}): anyone who reads "
            f"it can run code on your Ray cluster. Make it yours alone: chmod 600 {token}",
            RunWarning,
            stacklevel=3,
        )


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
