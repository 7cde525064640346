"""``flowrl doctor``: which resource bounds a run, from its plan X-ray, with the numbers and the knob to turn."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from flowrl.cli.args import RUN_DIR_HELP, add_command, add_last_flag
from flowrl.cli.exits import EXIT_OK

if TYPE_CHECKING:
    from flowrl.cli.args import Subparsers


def run(args: argparse.Namespace) -> int:
    """``flowrl doctor RUN_DIR``: print the diagnosis (as a report, or ``--json``)."""
    from flowrl.plan.doctor import diagnose_run

    diagnosis = diagnose_run(args.run_dir, last=args.last)
    print(json.dumps(diagnosis.to_dict(), indent=2) if args.json else diagnosis.report())
    return EXIT_OK


HELP = "say which resource bounds a run (from its plan X-ray), with the numbers and the knob to turn"
DESCRIPTION = (
    "Read the plan X-ray of a run's last iterations (result['plan'] in progress.jsonl) and "
    "say whether it is env-, inference-, learner-, transfer- or driver-bound, or held "
    "back by a straggler worker; the numbers behind the verdict and the config keys to turn."
)


def add_parser(subparsers: Subparsers) -> None:
    """Register ``flowrl doctor`` and its flags."""
    doctor = add_command(subparsers, "doctor", run, help=HELP, description=DESCRIPTION, run_dir=RUN_DIR_HELP)
    add_last_flag(
        doctor, "iterations to read, from the end (default 5; the first iteration is left out when there are more)", 5
    )
    doctor.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
