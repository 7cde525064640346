"""The exit statuses of the ``flowrl`` command and how it reports an error or a signal.

:mod:`flowrl.cli.main` documents what each status means; every subcommand returns one of them.
"""

from __future__ import annotations

import signal
from typing import TextIO

from flowrl.errors import (
    CheckpointError,
    CLIError,
    ClusterConnectionError,
    ConfigError,
    EnvError,
    FlowRLError,
    OfflineDataError,
    RunError,
    UnknownAlgorithmError,
)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
USAGE_ERRORS = (
    CLIError,
    ConfigError,
    EnvError,
    UnknownAlgorithmError,
    CheckpointError,
    OfflineDataError,
    RunError,
    ClusterConnectionError,
)
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for a Ctrl-C


def exit_status_for(signum: int) -> int:
    """The exit status for a run ended by signal ``signum``: 128 + its number, as shells report it."""
    return 128 + int(signum)


def signal_label(signum: signal.Signals) -> str:
    """How a signal is named to the user: ``Ctrl-C`` for SIGINT, else its name."""
    return "Ctrl-C" if signum == signal.SIGINT else signum.name


def report_error(error: BaseException, stream: TextIO) -> None:
    """Print ``flowrl: error: ...`` for ``error`` on ``stream``."""
    # An error raised inside a Ray task arrives wrapped; its cause carries the message meant for the user.
    cause = getattr(error, "cause", None)
    if isinstance(cause, FlowRLError):
        error = cause
    print(f"flowrl: error: {error}", file=stream, flush=True)
