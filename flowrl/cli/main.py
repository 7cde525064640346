# PYTHON_ARGCOMPLETE_OK (argcomplete's global completion completes only scripts that say so)
"""The ``flowrl`` command: train, resume, tune and evaluate runs, list algorithms, print execution plans.

This module builds the parser from the subcommands' modules (each registers its own parser and
flags with ``add_parser`` and runs with ``run``), runs the one asked for and turns what ends it
into an exit status. ``flowrl --version`` prints flowrl's version and Ray's, PyTorch's and Python's.
With ``argcomplete`` installed (the ``completion`` extra), the shell completes
commands and flags after ``eval "$(register-python-argcomplete flowrl)"``. Each subcommand parses
flags, calls the library and prints. ``flowrl train``
(:mod:`flowrl.cli.train`) is a shell over :mod:`flowrl.runs.run` (the run directory, stop criteria,
checkpoints, resuming), and ``--config`` files are read by :mod:`flowrl.runs.experiment`; ``flowrl
tune`` is a shell over :func:`flowrl.tune.run`, ``flowrl export`` over
:func:`flowrl.serve.export.export_policy`, ``flowrl record`` over
:func:`flowrl.engine.record.record_checkpoint` and ``flowrl plot`` over :func:`flowrl.outputs.plot.plot_runs`.

Exit statuses:

- 0: done (a stop criterion was met, or with ``--resume`` already was).
- 1: training failed (a worker that cannot be recovered, an env or learner error, any error
  raised while training): ``flowrl: error: ...``, then the checkpoint saved for it (when the
  Trainer's state was intact; else why none was), and the ``flowrl train --resume RUN_DIR``
  command.
- 2: an error a user can cause (an unknown algorithm or env, an invalid config, a bad ``--set``
  or flag, an unreadable config file, run directory or checkpoint, experience files that cannot
  serve the run (``input``) or an ``--out`` that already holds some, a ``--storage-path`` that
  cannot hold checkpoints, a Ray cluster that cannot be joined): ``flowrl: error: ...`` on
  stderr, without a traceback.
- ``tune``: 0 when every trial ended, 1 when a trial failed, 128 + the signal's number when a
  signal interrupted the experiment (Tune saves its state first; ``flowrl tune --resume EXP_DIR``
  continues it).
- 128 + the signal's number when a signal ended training: 130 for SIGINT (Ctrl-C), 143 for
  SIGTERM, 129 for SIGHUP. ``train`` first saves a checkpoint and prints the resume command;
  a second signal while it saves abandons that checkpoint (the previous one stays the
  latest) and exits with the same status.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from flowrl.cli import doctor, evaluate, export, plan, plot, record, trace, train, tune
from flowrl.cli import list as list_command
from flowrl.cli.exits import EXIT_FAILURE, EXIT_USAGE, USAGE_ERRORS, exit_status_for, report_error, signal_label
from flowrl.config.rllib import RLlibConfigNote
from flowrl.errors import FlowRLError, RunWarning
from flowrl.runs.signals import interrupt_signal
from flowrl.storage.versions import runtime_versions

# The subcommands in the order `flowrl --help` lists them.
COMMANDS = (train, tune, list_command, plan, trace, doctor, evaluate, record, export, plot)


def version_text() -> str:
    """``flowrl <version>`` and the versions of Ray, PyTorch and Python it runs with (read without importing them)."""
    versions = runtime_versions()
    found = [
        f"{name} {versions.get(distribution, 'not installed')}"
        for name, distribution in (("Ray", "ray"), ("PyTorch", "torch"))
    ]
    return f"flowrl {versions['flowrl']} ({', '.join(found)}, Python {versions['python']})"


class _VersionAction(argparse.Action):
    """``--version``: print :func:`version_text` and exit (the text is made only when asked for)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``flowrl`` command."""
    parser = argparse.ArgumentParser(prog="flowrl", description="Distributed RL as dataflow execution plans.")
    parser.add_argument("--version", action=_VersionAction, help="print the versions of flowrl, Ray, PyTorch, Python")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def _complete(parser: argparse.ArgumentParser) -> None:
    """When the shell asks for completions (argcomplete's environment variables set), print them and exit;
    otherwise, and without argcomplete, nothing."""
    try:
        import argcomplete
    except ImportError:
        return
    argcomplete.autocomplete(parser)


@contextlib.contextmanager
def _run_warnings_as_messages() -> Iterator[None]:
    """Print :class:`~flowrl.errors.RunWarning` as ``flowrl: warning: ...`` lines and how RLlib keys were read
    (:class:`~flowrl.config.rllib.RLlibConfigNote`) as ``flowrl: note: ...``; other warnings as Python does."""
    show = warnings.showwarning

    def show_warning(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if issubclass(category, RunWarning):
            print(f"flowrl: warning: {message}", file=sys.stderr, flush=True)
        elif issubclass(category, RLlibConfigNote):
            print(f"flowrl: note: {message}", file=sys.stderr, flush=True)
        else:
            show(message, category, *args, **kwargs)

    warnings.showwarning = show_warning
    try:
        yield
    finally:
        warnings.showwarning = show


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``flowrl`` console script; returns the exit status."""
    parser = build_parser()
    _complete(parser)
    args = parser.parse_args(argv)
    try:
        with _run_warnings_as_messages():
            return args.func(args)
    except FlowRLError as e:
        report_error(e, sys.stderr)
        # Bad input is a usage error; anything else (a worker failing mid-run) is a failure.
        return EXIT_USAGE if isinstance(e, USAGE_ERRORS) else EXIT_FAILURE
    except KeyboardInterrupt as e:
        received = interrupt_signal(e)
        print(f"flowrl: interrupted ({signal_label(received)})", file=sys.stderr, flush=True)
        return exit_status_for(received)
