"""``flowrl list``: the algorithms, one line each, or one algorithm's config keys."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from flowrl.cli.args import add_command
from flowrl.cli.exits import EXIT_OK

if TYPE_CHECKING:
    from flowrl.cli.args import Subparsers


def run(args: argparse.Namespace) -> int:
    """``flowrl list [ALGO]``: print the algorithms, or ALGO's description and config keys."""
    from flowrl.algorithms import algorithm_descriptions, get_algorithm

    if args.algo:
        algorithm = get_algorithm(args.algo)  # imports that algorithm's module only
        print(f"{algorithm.name}: {algorithm.description}\n")
        print(algorithm.config_class.describe())
        return EXIT_OK
    descriptions = algorithm_descriptions()  # imports no algorithm module
    width = max(map(len, descriptions))
    for name, description in descriptions.items():
        print(f"{name:<{width}}  {description}")
    return EXIT_OK


def add_parser(subparsers: Subparsers) -> None:
    """Register ``flowrl list``."""
    lister = add_command(subparsers, "list", run, help="list the algorithms (or one algorithm's config keys)")
    lister.add_argument("algo", nargs="?", help="show this algorithm's config keys, defaults and docs")
