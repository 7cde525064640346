"""Exceptions a flowrl user can cause or meet.

Every error that bad input, misuse or a failed actor can produce derives from
:class:`FlowRLError`, so ``except FlowRLError`` catches all of flowrl's own errors
while programming bugs inside flowrl still surface as ordinary Python errors.
"""

from __future__ import annotations


class FlowRLError(Exception):
    """Base class of every error flowrl raises on purpose."""


class IteratorUsageError(FlowRLError):
    """A dataflow iterator was used in a way its semantics do not allow."""


class ShardFailedError(FlowRLError):
    """A shard actor of a parallel iterator died while serving items.

    (An exception raised by user code inside a shard reaches the driver as Ray's
    ``RayTaskError``, which is also an instance of the original exception type.)

    ``shard_index`` is the shard's position in its parallel iterator and
    ``iterator_name`` the chain it belonged to; the original exception is chained
    as ``__cause__``.
    """

    def __init__(self, message: str, *, shard_index: int, iterator_name: str) -> None:
        super().__init__(message)
        self.shard_index = shard_index
        self.iterator_name = iterator_name


class EnvError(FlowRLError):
    """An environment could not be found, created, or failed flowrl's checks."""


class UnknownEnvError(EnvError):
    """The env name is neither a registered flowrl env nor a Gymnasium id."""


class EnvCheckError(EnvError):
    """An env broke the Gymnasium API in a way that would corrupt training.

    The message names the method, the field, the value seen and the bound it broke.
    """
