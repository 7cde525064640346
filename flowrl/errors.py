"""Exceptions a flowrl user can cause or meet.

Every error that bad input, misuse or a failed actor can produce derives from
:class:`FlowRLError`, so ``except FlowRLError`` catches all of flowrl's own errors
while programming bugs inside flowrl still surface as ordinary Python errors.
:class:`RunWarning` is the warning a run gives about what does not stop it.
"""

from __future__ import annotations

#: The name flowrl's distribution takes on a package index (``pip install`` finds it once it is published).
DISTRIBUTION = "flowrl-ray"


def install_hint(extra: str | None = None) -> str:
    """How to install optional-dependency group ``extra`` (an extra of ``pyproject.toml``; None: flowrl and its
    required dependencies), for a message: from a clone of the repository, and by the distribution's name once
    it is published."""
    target = f"[{extra}]" if extra else ""
    return f"pip install -e '.{target}' in a clone of flowrl (pip install '{DISTRIBUTION}{target}' once published)"


class FlowRLError(Exception):
    """Base class of every error flowrl raises on purpose."""


class IteratorUsageError(FlowRLError):
    """A dataflow iterator was used in a way its semantics do not allow."""


class ShardFailedError(FlowRLError):
    """A shard actor of a parallel iterator failed while serving items.

    ``reason`` says how: ``"died"`` (the actor is gone), ``"raised"`` (code inside the
    shard raised; only gathers with a failure hook report this, others let Ray's
    ``RayTaskError`` through, which is also an instance of the original exception type) or
    ``"timed_out"`` (no item within the gather's ``shard_timeout_s``; the actor may be hung).
    ``shard_index`` is the shard's position in its parallel iterator and ``iterator_name``
    the chain it belonged to; the original exception, if any, is chained as ``__cause__``.
    """

    def __init__(self, message: str, *, shard_index: int = -1, iterator_name: str = "", reason: str = "died") -> None:
        # Defaults let Ray unpickle it (exceptions are rebuilt from their message, then their attributes).
        super().__init__(message)
        self.shard_index = shard_index
        self.iterator_name = iterator_name
        self.reason = reason


class EnvError(FlowRLError):
    """An environment could not be found, created, or failed flowrl's checks."""


class UnknownEnvError(EnvError):
    """The env name is neither a registered flowrl env nor a Gymnasium id."""


class EnvCheckError(EnvError):
    """An env broke the Gymnasium API in a way that would corrupt training.

    The message names the method, the field, the value seen and the bound it broke.
    """


class ConfigError(FlowRLError, ValueError):
    """A config had unknown keys or invalid values (also a ``ValueError``, as Python's own bad-value errors are).

    ``problems`` lists every problem found, one message each (the key, the value seen
    and what would be valid), and the error's message shows them one per line, so a
    user fixes them all in one pass instead of one per run.
    """

    def __init__(self, problems: list[str] | str) -> None:
        self.problems: list[str] = [problems] if isinstance(problems, str) else list(problems)
        count = len(self.problems)
        lines = "\n".join(f"  - {problem}" for problem in self.problems)
        super().__init__(f"invalid config ({count} problem{'' if count == 1 else 's'}):\n{lines}")

    def __reduce__(self) -> tuple[type[ConfigError], tuple[list[str]]]:
        # Ray ships exceptions between processes by pickling; keep the list, not the text.
        return (type(self), (self.problems,))


class FrozenConfigError(FlowRLError, AttributeError):
    """A key of a frozen config (one handed to policies and workers) was assigned.

    Also an ``AttributeError``, what assigning to a read-only attribute raises in Python.
    """


class CheckpointError(FlowRLError):
    """A checkpoint is missing, incomplete, corrupt, or belongs to another algorithm."""


class UnknownAlgorithmError(FlowRLError):
    """The algorithm name is not registered."""


class RunError(FlowRLError):
    """A run's setup cannot be used: a run directory or its ``params.json``, an experiment file,
    or stop criteria. The message names the directory or file and what is wrong with it."""


class CLIError(FlowRLError):
    """A command-line argument, or a file it names, cannot be used; the message says why and what would work."""


class LearnerThreadError(FlowRLError):
    """The background learner thread of a plan failed while learning.

    Raised in the driver by ``LearnerThread.check()`` (so by a ``Dequeue`` of its output
    queue): the message carries the original exception's type, message and the
    traceback formatted in the learner thread, and the original exception is chained as
    ``__cause__``.
    """


class ReplayBufferError(FlowRLError, ValueError):
    """A replay buffer was built with, fed, or asked for something it cannot use.

    Also a ``ValueError``, so code that checks priorities with ``except ValueError`` works.
    """


class OfflineDataError(FlowRLError, ValueError):
    """Experience files cannot be written or used: a missing or empty dataset, files that are not
    flowrl experiences, spaces or columns that do not match the run. The message names the path
    and what was expected."""


class WorkerFailureError(FlowRLError):
    """Rollout workers failed past what the run may absorb: the restart cap was reached, or none is left.

    ``worker_indices`` names the workers (1-based, as in ``env_config.worker_index``); the
    message carries the last failure's remote traceback, which is also chained as ``__cause__``.
    """

    def __init__(self, message: str, *, worker_indices: list[int] | None = None) -> None:
        super().__init__(message)
        self.worker_indices = list(worker_indices or [])


class PlanStoppedError(FlowRLError):
    """``train()`` was called on a trainer whose plan already ended with an error; the message says which."""


class BadObservationError(EnvError):
    """An env produced an observation or reward that must not reach the learner: not finite, of the
    wrong shape or dtype, or outside its space. The message names worker, env index, step, field,
    value and bound."""


class NonFiniteUpdateError(FlowRLError):
    """Too many updates in a row had a non-finite loss or gradient (each was skipped, weights unchanged)."""


class ReplayShardError(FlowRLError):
    """A replay shard actor failed to store a batch or to take new priorities; the message carries its error."""


class ResourceUnavailableError(FlowRLError):
    """Ray could not start a run's actors within ``worker_startup_timeout_s``; the message names what they need."""


class ClusterConnectionError(FlowRLError):
    """The Ray cluster at the given address cannot be joined (unreachable, or its token authentication
    refused this driver)."""


class CallbackError(FlowRLError):
    """A hook of the run's ``callbacks`` raised, or stored a custom metric that is not a number.

    The message names the callbacks class, the hook and where it ran (worker, env, episode);
    the original exception is chained as ``__cause__``. It fails the iteration it happened in:
    a rollout worker whose callback raised is not restarted, since its replacement would run
    the same code.
    """


class RunWarning(UserWarning):
    """Something about a run a user should know, that does not stop it (a skipped checkpoint, a metric never seen)."""
