"""``flowrl export``: a checkpoint's policy written as a TorchScript or ONNX model for serving, with its description."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from flowrl.cli.args import add_allow_import_flag, add_command, int_at_least
from flowrl.cli.exits import EXIT_OK
from flowrl.errors import install_hint

if TYPE_CHECKING:
    from flowrl.cli.args import Subparsers


def run(args: argparse.Namespace) -> int:
    """``flowrl export RUN_DIR``: write the model and say what it takes and gives."""
    from flowrl.serve.export import export_policy  # loads PyTorch: only for this command

    model = export_policy(
        args.run_dir,
        format=args.format,
        out=args.out,
        policy_id=args.policy,
        checkpoint=args.checkpoint,
        allow_imports=args.allow_imports,
    )
    description = json.loads(model.with_name(model.name + ".json").read_text(encoding="utf-8"))

    def shown(tensor: Mapping[str, Any]) -> str:
        return f"{tensor['name']} {tensor['dtype']}[{', '.join(map(str, tensor['shape']))}]"

    print(f"exported policy {description['policy_id']} ({description['algo']}) of {description['checkpoint']}")
    print(f"model: {model}")
    print(f"description: {model.with_name(model.name + '.json')}")
    print(f"input: {shown(description['input'])}; outputs: {', '.join(shown(o) for o in description['outputs'])}")
    return EXIT_OK


HELP = "export a checkpoint's policy as a TorchScript or ONNX model for serving"
DESCRIPTION = (
    "Write a model mapping a batch of observations to greedy actions (and what "
    "they were chosen from), loadable with torch or onnxruntime alone, and a "
    "JSON file beside it describing its input and outputs."
)


def add_parser(subparsers: Subparsers) -> None:
    """Register ``flowrl export`` and its flags."""
    exporter = add_command(
        subparsers,
        "export",
        run,
        help=HELP,
        description=DESCRIPTION,
        run_dir="a run directory, a checkpoint directory or a flowrl tune trial directory (its best checkpoint)",
    )
    exporter.add_argument(
        "--checkpoint",
        type=int_at_least(0),
        metavar="N",
        help="export the run's checkpoint of iteration N (default: its latest; a Tune trial's: its best)",
    )
    exporter.add_argument(
        "--format",
        choices=("torchscript", "onnx"),
        required=True,
        help=f"torchscript (.pt, needs torch) or onnx (.onnx, needs onnxruntime; {install_hint('export')})",
    )
    exporter.add_argument(
        "--out", metavar="DIR", help="directory to write into (default: exports/<checkpoint> in the run directory)"
    )
    exporter.add_argument(
        "--policy", metavar="ID", help="the policy to export, for checkpoints holding several (multi-agent)"
    )
    add_allow_import_flag(exporter)
