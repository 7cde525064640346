"""The flags several ``flowrl`` subcommands share, and what is built from them.

``--set`` parsing (:func:`parse_value`, :func:`parse_set`, :func:`apply_set`), the config flags
(``--algo``, ``--env``, ``--num-workers``, ``--config``, ``--set``, ``--address``), the argument
types that check a flag's value, and the settings built from the flags: the config
(:func:`build_config`), a new run's ``(algorithm, env, config, stop)`` (:func:`train_settings`),
its checkpoint and tracker settings.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

from flowrl.config import parse_iteration_window
from flowrl.config.rllib import RLLIB_MARKER
from flowrl.errors import CLIError
from flowrl.runs.experiment import load_experiment_file, parse_experiment

if TYPE_CHECKING:  # algorithms import torch: load them only when a command needs them
    from flowrl.algorithms import Algorithm

# What `add_subparsers` returns: each subcommand's `add_parser(subparsers)` registers its parser there.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

# --- --set values -----------------------------------------------------------------------------------


def parse_value(text: str) -> Any:
    """A ``--set`` value: JSON when it parses (numbers, true/false, null, lists, dicts), else the string.

    Python's ``True``/``False``/``None`` are accepted too, since they are what people type.
    """
    try:
        return json.loads(text)
    except ValueError:
        pass
    stripped = text.strip()
    return {"True": True, "False": False, "None": None}.get(stripped, stripped)


def parse_set(items: Sequence[str]) -> list[tuple[list[str], Any]]:
    """``["model.fcnet_hiddens=[64,64]", ...]`` -> ``[(["model", "fcnet_hiddens"], [64, 64]), ...]``."""
    parsed = []
    for item in items:
        key, sep, raw = item.partition("=")
        path = [part.strip() for part in key.split(".")]
        if not sep or not all(path):
            raise CLIError(
                f"--set {item!r} is not key=value; examples: --set lr=0.001, "
                f"--set model.fcnet_hiddens=[64,64], --set 'env_config={{\"max_steps\": 100}}'"
            )
        parsed.append((path, parse_value(raw)))
    return parsed


def apply_set(
    config: dict[str, Any], assignments: Sequence[tuple[list[str], Any]], defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """A copy of ``config`` with each ``(path, value)`` set; a dotted path sets a key inside a dict value.

    A dict a nested key goes into starts from ``config``'s value, else from the algorithm's
    default (``defaults``), so ``--set model.fcnet_hiddens=[64]`` keeps the other model keys.
    """
    config = copy.deepcopy(config)
    for path, value in assignments:
        target = config
        for depth, part in enumerate(path[:-1]):
            if part not in target:
                default = defaults.get(part, {}) if depth == 0 else {}
                target[part] = copy.deepcopy(default)  # not a dict: reported just below
            if not isinstance(target[part], dict):
                shown = ".".join(path[: depth + 1])
                raise CLIError(
                    f"--set {'.'.join(path)}=...: {shown} is {target[part]!r} ({type(target[part]).__name__}), "
                    f"not a dict, so it has no key {path[depth + 1]!r}"
                )
            target = target[part]
        target[path[-1]] = value
    return config


# --- settings from the flags ------------------------------------------------------------------------


def _get_algorithm(name: str | None, source: str) -> Algorithm:
    from flowrl.algorithms import get_algorithm, list_algorithms

    if not name:
        raise CLIError(
            f"{source} needs --algo NAME (or 'algo' in the --config file); available: {', '.join(list_algorithms())}"
        )
    return get_algorithm(name)  # UnknownAlgorithmError names the closest algorithms


def build_config(algorithm: Algorithm, file_config: Mapping[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The config dict: algorithm defaults < config file < ``--set`` < ``--num-workers`` / ``--seed``.

    Keys left out keep the algorithm's defaults (the Trainer fills them in); the result is
    validated (``ConfigError`` listing every problem) before it is returned.
    """
    defaults = algorithm.config_class.from_dict({}).to_dict()
    if RLLIB_MARKER in file_config:
        defaults["model"] = {}  # an RLlib config's model keys left out take RLlib's model defaults, not flowrl's
    config = apply_set(dict(file_config), parse_set(args.set or []), defaults)
    if getattr(args, "num_workers", None) is not None:
        config["num_workers"] = args.num_workers
    if getattr(args, "seed", None) is not None:
        config["seed"] = args.seed
    algorithm.config_class.from_dict(config)  # every problem at once, before Ray or any actor starts
    return config


def stop_from_flags(args: argparse.Namespace) -> dict[str, float]:
    """The stop criteria given as flags."""
    given = {
        "episode_reward_mean": getattr(args, "stop_reward", None),
        "timesteps_total": getattr(args, "stop_timesteps", None),
        "training_iteration": getattr(args, "stop_iters", None),
    }
    return {key: value for key, value in given.items() if value is not None}


def train_settings(
    args: argparse.Namespace, command: str = "train"
) -> tuple[Algorithm, str, dict[str, Any], dict[str, float]]:
    """``(algorithm, env, config, stop)`` of a new run from the flags and the ``--config`` file."""
    from flowrl.envs import get_env_creator

    experiment = load_experiment_file(args.config) if args.config else parse_experiment({})
    algorithm = _get_algorithm(args.algo or experiment["algo"], command)
    env = args.env or experiment["env"]
    if not env:
        raise CLIError(f"{command} needs --env ID (or 'env' in the --config file), e.g. --env CartPole-v1")
    get_env_creator(env)  # UnknownEnvError names the closest ids
    config = build_config(algorithm, experiment["config"], args)
    stop = {**experiment["stop"], **stop_from_flags(args)}
    return algorithm, env, config, stop


def checkpoint_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The checkpoint settings given as flags, as :class:`~flowrl.storage.rundir.RunSpec` keywords (flags left out are absent)."""
    given = {
        "checkpoint_freq": getattr(args, "checkpoint_freq", None),
        "checkpoint_interval_s": getattr(args, "checkpoint_interval_s", None),
        "keep_checkpoints": getattr(args, "keep_checkpoints", None),
        "keep_best": getattr(args, "keep_best", None),
    }
    return {key: value for key, value in given.items() if value is not None}


def tracker_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The trackers given as flags (``--wandb``, ``--mlflow``), as :class:`~flowrl.storage.rundir.RunSpec` keywords."""
    given = {"wandb_project": getattr(args, "wandb", None), "mlflow_tracking_uri": getattr(args, "mlflow", None)}
    return {key: value for key, value in given.items() if value is not None}


# --- argument types and shared flags ----------------------------------------------------------------


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argument type: an integer >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be >= {minimum}")
        return value

    parse.__name__ = "int"
    return parse


def finite_float(text: str) -> float:
    """An argument type: a finite number."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number")
    return value


def seconds(text: str) -> float:
    """An argument type: seconds >= 0 (0: off)."""
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0 seconds (0: off)")
    return value


def positive_seconds(text: str) -> float:
    """An argument type: seconds > 0."""
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0 seconds")
    return value


def iteration_window(text: str) -> tuple[int, int]:
    """An argument type: ``A:B`` (iterations A to B) or ``N`` (iteration N)."""
    try:
        window = parse_iteration_window(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if window is None:
        raise argparse.ArgumentTypeError("give A:B (iterations A to B) or N (iteration N)")
    return window


ADDRESS_HELP = "Ray cluster to join (default: $RAY_ADDRESS, else start an embedded local Ray)"
RUN_DIR_HELP = "a run directory (flowrl train's)"


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that say what to run: ``--algo``, ``--env``, ``--num-workers``, ``--config``, ``--set``, ``--address``."""
    parser.add_argument("--algo", help="algorithm name (see `flowrl list`)")
    parser.add_argument(
        "--env", help="Gymnasium id or flowrl env name, e.g. CartPole-v1 or the multi-agent MultiAgentCartPole"
    )
    parser.add_argument(
        "--num-workers",
        type=int_at_least(0),
        metavar="N",
        help="remote rollout workers (0: sample in this process); overrides --config and --set",
    )
    parser.add_argument(
        "--config", metavar="FILE", help="YAML or JSON experiment file (algo, env, stop, config; or flat config keys)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a config key (repeatable); VALUE is JSON if it parses, else a string; "
        "dotted keys set inside dicts: model.fcnet_hiddens=[64,64]",
    )
    parser.add_argument("--address", default=None, help=ADDRESS_HELP)


def add_run_dir_parser(
    subparsers: Subparsers, name: str, *, help: str, description: str, run_dir_help: str = RUN_DIR_HELP
) -> argparse.ArgumentParser:
    """The parser of subcommand ``name``, which reads the run directory given as its RUN_DIR argument."""
    parser = subparsers.add_parser(name, help=help, description=description)
    parser.add_argument("run_dir", metavar="RUN_DIR", help=run_dir_help)
    return parser
