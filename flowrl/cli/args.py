"""The flags several ``flowrl`` subcommands share, and what is built from them.

``--set`` parsing (:func:`parse_value`, :func:`parse_set`, :func:`apply_set`), the argument types
that check a flag's value, a subcommand's registration (:func:`add_command`), the flags declared
once for the commands that share them (the config flags ``--algo``, ``--env``, ``--num-workers``,
``--config``, ``--set``, ``--address``; ``--results-dir``, ``--last``, the checkpoint flags), and the
settings built from the flags: the config (:func:`build_config`), a new run's ``(algorithm, env,
config, stop)`` (:func:`train_settings`), its checkpoint and tracker settings.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

from flowrl.config import parse_iteration_window
from flowrl.config.rllib import RLLIB_MARKER
from flowrl.errors import CLIError
from flowrl.runs.experiment import load_experiment_file, parse_experiment
from flowrl.storage.rundir import (
    DEFAULT_CHECKPOINT_INTERVAL_S,
    DEFAULT_KEEP_CHECKPOINTS,
    DEFAULT_RESULTS_DIR,
    PRIVATE_UMASK,
    parse_umask,
)

if TYPE_CHECKING:  # algorithms import torch: load them only when a command needs them
    from flowrl.algorithms import Algorithm

# What `add_subparsers` returns: each subcommand's `add_parser(subparsers)` registers its parser there.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
# A new run's settings from the flags (:func:`train_settings`): ``(algorithm, env, config, stop)``.
TrainSettings: TypeAlias = "tuple[Algorithm, str, dict[str, Any], dict[str, float]]"

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


def build_config(
    algorithm: Algorithm,
    file_config: Mapping[str, Any],
    args: argparse.Namespace,
    *,
    assignments: Sequence[tuple[list[str], Any]] | None = None,
) -> dict[str, Any]:
    """The config dict: algorithm defaults < config file < ``--set`` < ``--num-workers`` / ``--seed``.

    Keys left out keep the algorithm's defaults (the Trainer fills them in); the result is
    validated (``ConfigError`` listing every problem) before it is returned. ``assignments``:
    ``parse_set(args.set)``, when the caller has it already.
    """
    defaults = algorithm.config_class.from_dict({}).to_dict()
    if RLLIB_MARKER in file_config:
        defaults["model"] = {}  # an RLlib config's model keys left out take RLlib's model defaults, not flowrl's
    if assignments is None:
        assignments = parse_set(args.set or [])
    config = apply_set(dict(file_config), assignments, defaults)
    if getattr(args, "num_workers", None) is not None:
        config["num_workers"] = args.num_workers
    if getattr(args, "seed", None) is not None:
        config["seed"] = args.seed
    if getattr(args, "input", None) is not None:
        config["input"] = args.input
    algorithm.config_class.from_dict(config)  # every problem at once, before Ray or any actor starts
    return config


def _given(args: argparse.Namespace, dests: Mapping[str, str]) -> dict[str, Any]:
    """``{key: value}`` of the flags given among ``dests`` (``{key: the flag's dest}``); flags left out are absent,
    as are those the command does not have."""
    given = {key: getattr(args, dest, None) for key, dest in dests.items()}
    return {key: value for key, value in given.items() if value is not None}


def stop_from_flags(args: argparse.Namespace) -> dict[str, float]:
    """The stop criteria given as flags."""
    return _given(
        args,
        {"episode_reward_mean": "stop_reward", "timesteps_total": "stop_timesteps", "training_iteration": "stop_iters"},
    )


def train_settings(
    args: argparse.Namespace, command: str = "train", *, assignments: Sequence[tuple[list[str], Any]] | None = None
) -> TrainSettings:
    """``(algorithm, env, config, stop)`` of a new run from the flags and the ``--config`` file (``assignments``:
    ``parse_set(args.set)``, when the caller has it already)."""
    from flowrl.envs import get_env_creator

    experiment = load_experiment_file(args.config) if args.config else parse_experiment({})
    algorithm = _get_algorithm(args.algo or experiment["algo"], command)
    env = args.env or experiment["env"]
    if not env:
        raise CLIError(f"{command} needs --env ID (or 'env' in the --config file), e.g. --env CartPole-v1")
    get_env_creator(env)  # UnknownEnvError names the closest ids
    config = build_config(algorithm, experiment["config"], args, assignments=assignments)
    stop = {**experiment["stop"], **stop_from_flags(args)}
    return algorithm, env, config, stop


def checkpoint_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The checkpoint settings given as flags, as :class:`~flowrl.storage.rundir.RunSpec` keywords
    (flags left out are absent)."""
    return _given(args, {key: key for key in _CHECKPOINT_FLAGS})


def tracker_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The trackers given as flags (``--wandb``, ``--mlflow``), as :class:`~flowrl.storage.rundir.RunSpec` keywords."""
    return _given(args, {"wandb_project": "wandb", "mlflow_tracking_uri": "mlflow"})


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
HELP_WIDTH = 78  # a description written as given (a command with examples) is wrapped to this width


def add_command(
    subparsers: Subparsers,
    name: str,
    run: Callable[[argparse.Namespace], int],
    *,
    help: str,
    description: str | None = None,
    run_dir: str | None = None,
    examples: Sequence[str] = (),
) -> argparse.ArgumentParser:
    """Register subcommand ``name``, which ``run(args)`` carries out (returning the exit status); with ``run_dir``
    (its help), the command reads the run directory given as its RUN_DIR argument. ``examples``: command lines
    that ``--help`` lists after the flags, one a line, as written."""
    if examples:
        parser = subparsers.add_parser(
            name,
            help=help,
            description=textwrap.fill(description, HELP_WIDTH) if description else None,
            epilog="examples:\n" + "\n".join(f"  {example}" for example in examples),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    else:
        parser = subparsers.add_parser(name, help=help, description=description)
    if run_dir is not None:
        parser.add_argument("run_dir", metavar="RUN_DIR", help=run_dir)
    parser.set_defaults(func=run)
    return parser


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that say what to run: ``--algo``, ``--env``, ``--num-workers``, ``--input``, ``--config``,
    ``--set``, ``--address``."""
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
        "--input",
        metavar="SOURCE",
        help="recorded experiences to learn from (config key input: a directory, .parquet file or glob), for the "
        "offline algorithms (bc, marwil, cql); overrides --config and --set",
    )
    add_experiment_flag(parser, " (algo, env, stop, config; or flat config keys)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a config key (repeatable); VALUE is JSON if it parses, else a string; "
        "dotted keys set inside dicts: model.fcnet_hiddens=[64,64]",
    )
    add_address_flag(parser)


def add_experiment_flag(parser: argparse.ArgumentParser, holding: str) -> None:
    """``--config FILE``: the experiment file, and what it holds (``holding``, the rest of the help)."""
    parser.add_argument("--config", metavar="FILE", help=f"YAML or JSON experiment file{holding}")


def add_address_flag(parser: argparse.ArgumentParser) -> None:
    """``--address``: the Ray cluster to join."""
    parser.add_argument("--address", default=None, help=ADDRESS_HELP)


def add_allow_import_flag(parser: argparse.ArgumentParser) -> None:
    """``--allow-import MODULE`` (repeatable): a module a checkpoint may name and have imported (``allow_imports``)."""
    parser.add_argument(
        "--allow-import",
        action="append",
        dest="allow_imports",
        default=[],
        metavar="MODULE",
        help="let the checkpoint's config import MODULE and its submodules (a custom model, callbacks, a "
        "policy_mapping_fn named 'MODULE:name'); importing runs its code, so allow only what you trust; "
        "repeatable (default: nothing is imported)",
    )


#: The checkpoint flags by the :class:`~flowrl.storage.rundir.RunSpec` keyword each sets (the flag's name is the
#: keyword's, dashed: ``--checkpoint-freq``), with their ``add_argument`` keywords.
_CHECKPOINT_FLAGS: dict[str, dict[str, Any]] = {
    "checkpoint_freq": {
        "type": int_at_least(0),
        "metavar": "N",
        "help": "also checkpoint every N iterations (default 0: off)",
    },
    "checkpoint_interval_s": {
        "type": seconds,
        "metavar": "S",
        "help": f"checkpoint when S seconds have passed since the last one "
        f"(default {DEFAULT_CHECKPOINT_INTERVAL_S:g}; 0: off); "
        f"a run also checkpoints at the end, on an error and on Ctrl-C, SIGTERM or SIGHUP",
    },
    "keep_checkpoints": {
        "type": int_at_least(1),
        "metavar": "K",
        "help": f"keep the newest K checkpoints, deleting older ones (default {DEFAULT_KEEP_CHECKPOINTS})",
    },
    "keep_best": {
        "metavar": "METRIC",
        "help": "also keep a copy of the checkpoint with the highest METRIC (a result key, e.g. "
        "episode_reward_mean; a/b for a nested key) in checkpoints/best (default with "
        "evaluation_interval set: evaluation/episode_reward_mean)",
    },
}


def add_checkpoint_flags(parser: argparse.ArgumentParser) -> None:
    """The flags :func:`checkpoint_settings` reads: ``--checkpoint-freq``, ``--checkpoint-interval-s``,
    ``--keep-checkpoints``, ``--keep-best``."""
    for key, keywords in _CHECKPOINT_FLAGS.items():
        parser.add_argument("--" + key.replace("_", "-"), **keywords)


def add_results_dir_flag(parser: argparse.ArgumentParser, goes: str) -> None:
    """``--results-dir DIR``: where the directories the command writes go (``goes``: what goes there)."""
    parser.add_argument("--results-dir", metavar="DIR", help=f"where {goes} (default ./{DEFAULT_RESULTS_DIR})")


def umask(text: str) -> int:
    """An argument type: a umask in octal, e.g. ``022``."""
    try:
        return parse_umask(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_umask_flag(parser: argparse.ArgumentParser, directory: str) -> None:
    """``--umask UMASK``: the umask the command's ``directory`` is written under (default private: 077)."""
    parser.add_argument(
        "--umask",
        type=umask,
        default=PRIVATE_UMASK,
        metavar="UMASK",
        help=f"write the {directory} under this umask, in octal (default 077: directories 0700, files 0600, "
        f"since checkpoints hold the policy, the config and pickles; 022: 0755 and 0644, readable by all)",
    )


def add_last_flag(parser: argparse.ArgumentParser, help: str, default: int | None = None) -> None:
    """``--last N``: how many of a run's last iterations to read."""
    parser.add_argument("--last", type=int_at_least(1), default=default, metavar="N", help=help)
