"""Experiment specs for ``flowrl tune``: a tuned example with search spaces, checked and turned into Tune's objects.

The file is a tuned example (:mod:`flowrl.runs.experiment`: ``algo`` or ``run``, ``env``, ``stop``,
``config``; optionally under one experiment name) plus Tune's keys::

    cartpole-ppo-asha:                    # the experiment's name (optional)
      algo: ppo
      env: CartPole-v1
      stop: {training_iteration: 20}
      num_samples: 4                      # samples of the search space (each grid point num_samples times)
      metric: episode_reward_mean         # a result key ("/" reaches into nested ones); the default
      mode: max                           # the default
      max_concurrent_trials: 2            # default: as many as the cluster's CPUs fit
      checkpoint_freq: 10                 # checkpoint every 10 iterations (0: only at the end)
      keep_checkpoints: 5                 # per trial
      scheduler: {type: asha, grace_period: 2, max_t: 20}
      config:
        lr: {loguniform: [1.0e-4, 1.0e-2]}
        model: {fcnet_hiddens: {choice: [[32, 32], [64, 64]]}}

A search space is a one-key mapping whose key is one of
:data:`~flowrl.tune.search_space.SEARCH_SPACES`, anywhere in ``config`` (inside dict values too;
:mod:`flowrl.tune.search_space` parses them). :func:`parse_spec` and :func:`load_spec` check everything
(search spaces, every value they can take against the algorithm's config class, stop criteria,
scheduler and search algorithm arguments, PBT's mutations) and report every problem in one
:class:`~flowrl.errors.ConfigError`, without starting Ray.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ray.tune.schedulers import ASHAScheduler, PopulationBasedTraining, TrialScheduler
from ray.tune.search import Searcher

from flowrl.algorithms import get_algorithm
from flowrl.config import TrainerConfig
from flowrl.errors import ConfigError, FlowRLError, RunError, RunWarning, install_hint
from flowrl.runs.experiment import EXPERIMENT_KEYS, parse_experiment, read_experiment_data
from flowrl.storage.rundir import DEFAULT_KEEP_CHECKPOINTS, json_safe, parse_stop
from flowrl.tune.search_space import (
    SEARCH_SPACES,
    Spaces,
    _config_keys,
    _domain,
    _number_problem,
    _search_spaces,
    _space_name,
    _unknown_space,
    _value_problems,
)

#: Result keys that only grow, which schedulers may measure a trial's progress in.
TIME_ATTRS = ("training_iteration", "timesteps_total", "time_total_s", "episodes_total")
DEFAULT_METRIC = "episode_reward_mean"
DEFAULT_CHECKPOINT_FREQ = 10
#: The extra that installs Optuna for ``search_alg: {type: optuna}``.
OPTUNA_EXTRA = "tune-optuna"
#: Top-level keys of an experiment file besides the tuned example's (:data:`flowrl.runs.experiment.EXPERIMENT_KEYS`).
TUNE_KEYS = (
    "num_samples",
    "metric",
    "mode",
    "max_concurrent_trials",
    "checkpoint_freq",
    "keep_checkpoints",
    "scheduler",
    "search_alg",
)


@dataclasses.dataclass(frozen=True)
class TuneSpec:
    """A checked experiment: what :func:`flowrl.tune.run` hands to a ``ray.tune.Tuner``.

    ``param_space`` is the config with Tune's search-space objects in place of the file's
    search spaces; ``searched`` names the config keys a search space or a PBT mutation sets
    (``"model/fcnet_hiddens"`` for nested ones), the columns of ``trials.csv``. ``name`` is
    None when the spec gives none (:func:`flowrl.tune.run` then names the experiment
    ``<algo>_<env>_<timestamp>``). ``scheduler`` and ``search_alg`` are built Tune objects,
    which keep state: parse the spec again for another experiment. ``source`` is the spec
    as given (JSON data), saved in the experiment directory.
    """

    algo: str
    env: str
    param_space: dict[str, Any]
    name: str | None = None
    stop: dict[str, float] = dataclasses.field(default_factory=dict)
    num_samples: int = 1
    metric: str = DEFAULT_METRIC
    mode: str = "max"
    max_concurrent_trials: int | None = None
    checkpoint_freq: int = DEFAULT_CHECKPOINT_FREQ
    keep_checkpoints: int | None = DEFAULT_KEEP_CHECKPOINTS
    scheduler: TrialScheduler | None = None
    search_alg: Searcher | None = None
    searched: tuple[str, ...] = ()
    source: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def is_pbt(self) -> bool:
        """Whether the scheduler is population-based training (trials exchange checkpoints and configs)."""
        return isinstance(self.scheduler, PopulationBasedTraining)


def load_spec(path: str | os.PathLike[str]) -> TuneSpec:
    """Read and check a YAML or JSON experiment file (see :func:`parse_spec`).

    An unreadable file raises :class:`~flowrl.errors.RunError`; problems with its contents one
    :class:`~flowrl.errors.ConfigError`.
    """
    return parse_spec(read_experiment_data(path), source=f"experiment file {str(Path(path))!r}")


def parse_spec(data: Any, *, source: str = "the experiment") -> TuneSpec:
    """Check an experiment's parsed contents and build its Tune objects.

    ``data``: a tuned example plus :data:`TUNE_KEYS`, optionally under one experiment name.
    Raises :class:`~flowrl.errors.ConfigError` listing every problem, each naming the key, the
    value seen and what is valid. PBT mutating a key the algorithm cannot change on a running
    trainer is allowed (an exploit then rebuilds the trial's trainer from the checkpoint, which
    is slower) and warned about with a :class:`~flowrl.errors.RunWarning`.
    """
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source} must hold a mapping of keys to values, not {type(data).__name__}")
    name = None
    top_keys = set(EXPERIMENT_KEYS) | set(TUNE_KEYS)
    if len(data) == 1:
        ((key, inner),) = data.items()
        if key not in top_keys and isinstance(inner, Mapping) and set(inner) & top_keys:
            name, data = str(key), inner
    data = dict(data)
    tune_values = {key: data.pop(key) for key in TUNE_KEYS if key in data}
    problems: list[str] = []
    if name is not None and (not name.strip() or os.sep in name or "/" in name or name in (".", "..")):
        problems.append(f"experiment name {name!r} must be a directory name (not empty, no '/')")
    try:
        stop = parse_stop(data.pop("stop", None) or {}, source)
    except RunError as e:
        problems.append(str(e))
        stop = {}
    try:  # the tuned example's layout, as `flowrl train --config` reads it
        experiment = parse_experiment(data, source)
    except RunError as e:
        raise ConfigError(problems + [str(e)]) from None
    algo, env, config = experiment["algo"], experiment["env"], experiment["config"]

    config_class: type[TrainerConfig] | None = None
    live: frozenset[str] = frozenset()
    if not algo:
        problems.append(f"{source} names no algorithm: add algo (or run), e.g. algo: ppo")
    else:
        try:
            algorithm = get_algorithm(algo)
            algo, config_class, live = algorithm.name, algorithm.config_class, algorithm.live_keys
        except FlowRLError as e:
            problems.append(str(e))
    if not env:
        problems.append(f"{source} names no env: add env, e.g. env: CartPole-v1")
    else:
        from flowrl.envs import get_env_creator

        try:
            get_env_creator(env)
        except FlowRLError as e:
            problems.append(str(e))
    if config_class is not None:
        top_level = set(data) - set(EXPERIMENT_KEYS)
        config = _drop_misspelt_tune_keys(config, top_level, _config_keys(config_class), problems)

    settings = _settings(tune_values, problems)
    param_space, spaces = _search_spaces(config, config_class, (), problems)
    values_to_check = {path: values for path, (_, values) in spaces.items()}
    mutations: dict[str, Any] = {}
    scheduler_args = _scheduler_args(tune_values.get("scheduler"), problems)
    is_pbt = scheduler_args is not None and scheduler_args[0] == "pbt"
    if scheduler_args is not None and is_pbt:
        config_keys = _config_keys(config_class) if config_class is not None else None
        given = scheduler_args[1].pop("hyperparam_mutations", None)
        mutations = _mutations(given, str(algo), config_keys, values_to_check, problems)
    search_args = _search_alg_args(tune_values.get("search_alg"), spaces, problems)
    if search_args is not None and is_pbt:
        problems.append("search_alg cannot be used with scheduler type pbt (Tune's PBT explores by itself); remove one")
    if config_class is not None:
        grids = {path for path, (space, _) in spaces.items() if space == "grid_search"}
        problems += _value_problems(config_class, param_space, values_to_check, grids)
    if problems:
        raise ConfigError(list(dict.fromkeys(problems)))  # a problem every checked value shares, once

    assert algo is not None and env is not None  # a missing one is a problem above
    not_live = sorted(key for key in mutations if key not in live)
    if not_live:
        warnings.warn(
            f"PBT mutates {', '.join(not_live)}, which a running {algo} trainer cannot change: an exploit that changes "
            f"{'it' if len(not_live) == 1 else 'one'} rebuilds the trial's trainer and restores the checkpoint into it "
            f"(slower); {algo} changes {', '.join(sorted(live)) or 'no key'} live",
            RunWarning,
            stacklevel=2,
        )
    searched = tuple(dict.fromkeys(["/".join(path) for path in spaces] + list(mutations)))
    return TuneSpec(
        algo=algo,
        env=env,
        param_space=param_space,
        name=name,
        stop=stop,
        scheduler=_build_scheduler(scheduler_args, mutations),
        search_alg=_build_search_alg(search_args),
        searched=searched,
        source=json_safe({**tune_values, **data, "stop": stop}),
        **settings,
    )


# --- top-level settings -------------------------------------------------------------------------


def _settings(values: Mapping[str, Any], problems: list[str]) -> dict[str, Any]:
    """The valid top-level Tune settings among ``values`` (scheduler and search_alg aside), as TuneSpec keywords."""
    checks: dict[str, Callable[[Any], str | None]] = {
        "num_samples": lambda v: _number_problem("num_samples", v, integer=True, at_least=1),
        "max_concurrent_trials": lambda v: (
            None if v is None else _number_problem("max_concurrent_trials", v, integer=True, at_least=1)
        ),
        "checkpoint_freq": lambda v: _number_problem("checkpoint_freq", v, integer=True, at_least=0),
        "keep_checkpoints": lambda v: (
            None if v is None else _number_problem("keep_checkpoints", v, integer=True, at_least=1)
        ),
        "metric": lambda v: (
            None
            if isinstance(v, str) and v
            else f"metric={v!r} must be a result key (a string, '/' between nested keys), e.g. {DEFAULT_METRIC}"
        ),
        "mode": lambda v: None if v in ("max", "min") else f"mode={v!r} must be 'max' or 'min'",
    }
    settings = {}
    for key, check in checks.items():
        if key in values:
            problem = check(values[key])
            if problem:
                problems.append(problem)
            else:
                settings[key] = values[key]
    return settings


def _drop_misspelt_tune_keys(
    config: dict[str, Any], top_level: set[str], config_keys: Mapping[str, Any], problems: list[str]
) -> dict[str, Any]:
    """``config`` without the top-level keys that are no config key but look like one of :data:`TUNE_KEYS`
    (each a problem naming the Tune key), which would otherwise be reported as unknown config keys."""
    kept = dict(config)
    for key in sorted(top_level - set(config_keys), key=str):
        close = difflib.get_close_matches(str(key), TUNE_KEYS, n=1, cutoff=0.75)
        if close:
            problems.append(f"unknown key {key!r}; did you mean {close[0]!r}?")
            del kept[key]
    return kept


# --- schedulers and search algorithms ------------------------------------------------------------


def _time_attr(where: str) -> Callable[[Any], str | None]:
    return lambda v: None if v in TIME_ATTRS else f"{where}={v!r} must be one of {', '.join(TIME_ATTRS)}"


def _boolean(where: str) -> Callable[[Any], str | None]:
    return lambda v: None if isinstance(v, bool) else f"{where}={v!r} must be true or false"


def _factors(v: Any) -> str | None:
    pair = isinstance(v, list) and len(v) == 2 and all(_number_problem("", x, above=0) is None for x in v)
    return (
        None if pair else (f"scheduler.perturbation_factors={v!r} must be [up, down], two numbers > 0, e.g. [1.2, 0.8]")
    )


# Each scheduler's arguments (Tune's names) and their checks; metric and mode come from the top level.
_SCHEDULER_ARGS: dict[str, dict[str, Callable[[Any], str | None]]] = {
    "fifo": {},
    "asha": {
        "time_attr": _time_attr("scheduler.time_attr"),
        "max_t": lambda v: _number_problem("scheduler.max_t", v, above=0),
        "grace_period": lambda v: _number_problem("scheduler.grace_period", v, above=0),
        "reduction_factor": lambda v: _number_problem("scheduler.reduction_factor", v, above=1),
        "brackets": lambda v: _number_problem("scheduler.brackets", v, integer=True, at_least=1),
        "stop_last_trials": _boolean("scheduler.stop_last_trials"),
    },
    "pbt": {
        "time_attr": _time_attr("scheduler.time_attr"),
        "perturbation_interval": lambda v: _number_problem("scheduler.perturbation_interval", v, above=0),
        "burn_in_period": lambda v: _number_problem("scheduler.burn_in_period", v, at_least=0),
        "hyperparam_mutations": lambda v: None,  # checked by _mutations
        "quantile_fraction": lambda v: _number_problem("scheduler.quantile_fraction", v, at_least=0, at_most=0.5),
        "resample_probability": lambda v: _number_problem("scheduler.resample_probability", v, at_least=0, at_most=1),
        "perturbation_factors": _factors,
        "log_config": _boolean("scheduler.log_config"),
        "require_attrs": _boolean("scheduler.require_attrs"),
        "synch": _boolean("scheduler.synch"),
    },
}
_SEARCH_ALG_ARGS: dict[str, dict[str, Callable[[Any], str | None]]] = {
    "optuna": {
        "seed": lambda v: _number_problem("search_alg.seed", v, integer=True, at_least=0),
        "points_to_evaluate": lambda v: (
            None
            if isinstance(v, list) and all(isinstance(p, Mapping) for p in v)
            else f"search_alg.points_to_evaluate={v!r} must be a list of configs (mappings of config key to value)"
        ),
    },
}


def _typed_args(
    section: str,
    value: Any,
    known: Mapping[str, Mapping[str, Callable[[Any], str | None]]],
    example: str,
    problems: list[str],
) -> tuple[str, dict[str, Any]] | None:
    """``(type, arguments)`` of a ``scheduler`` or ``search_alg`` section (None if absent or of no known type).

    Each argument's problems are added to ``problems``; the arguments are only built into
    Tune's objects when there are none.
    """
    if value is None:
        return None
    if isinstance(value, str):
        value = {"type": value}
    if not isinstance(value, Mapping):
        problems.append(f"{section} must be a mapping like {{type: {example}, ...}}, got {value!r}")
        return None
    args = dict(value)
    kind = args.pop("type", None)
    if kind not in known:
        problems.append(f"{section}.type={kind!r} must be one of {', '.join(known)}")
        return None
    checks = known[kind]
    for arg, arg_value in args.items():
        if arg in ("metric", "mode"):
            problems.append(
                f"{section}.{arg}: set {arg} at the top level of the experiment (Tune's {section} takes it from there)"
            )
        elif arg not in checks:
            problems.append(f"{section} type {kind} has no argument {arg!r}; valid: {', '.join(checks) or 'none'}")
        else:
            problem = checks[arg](arg_value)
            if problem:
                problems.append(problem)
    return kind, args


def _scheduler_args(value: Any, problems: list[str]) -> tuple[str, dict[str, Any]] | None:
    found = _typed_args("scheduler", value, _SCHEDULER_ARGS, "asha", problems)
    if found is None:
        return None
    kind, args = found
    grace, max_t = args.get("grace_period", 1), args.get("max_t", 100)  # Tune's defaults
    if kind == "asha" and all(_number_problem("", x, above=0) is None for x in (grace, max_t)) and grace > max_t:
        problems.append(f"scheduler.grace_period={grace!r} > scheduler.max_t={max_t!r}")
    return found


def _mutations(
    value: Any,
    algo: str,
    config_keys: Mapping[str, Any] | None,
    values_to_check: dict[tuple[str, ...], list[Any]],
    problems: list[str],
) -> dict[str, Any]:
    """PBT's ``hyperparam_mutations`` as Tune takes them; adds the values each can set to ``values_to_check``.

    ``config_keys``: those of algorithm ``algo`` (None when it is unknown), which the mutated keys must be.
    A ``choice`` becomes a list: PBT multiplies values drawn from a Tune domain by its
    perturbation factors, which only numbers survive, and moves to a neighbouring value in a list.
    """
    if not value:
        problems.append("scheduler type pbt needs hyperparam_mutations: {config key: [values] or a search space, ...}")
        return {}
    if not isinstance(value, Mapping):
        problems.append(f"scheduler.hyperparam_mutations={value!r} must map config keys to [values] or a search space")
        return {}
    mutations: dict[str, Any] = {}
    for key, mutation in value.items():
        where = f"scheduler.hyperparam_mutations.{key}"
        space = _space_name(mutation)
        if config_keys is not None and key not in config_keys:
            close = difflib.get_close_matches(str(key), list(config_keys), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            problems.append(f"{where}: {key!r} is not a config key of {algo}{hint}")
            continue
        if isinstance(mutation, list) and mutation:
            mutations[key], values = mutation, mutation
        elif space == "choice" and isinstance(mutation[space], list) and mutation[space]:
            mutations[key], values = mutation[space], mutation[space]
        elif space is not None and space != "grid_search":
            built = _domain(where, space, mutation[space], problems)
            if built is None:
                continue
            mutations[key], values = built
        elif space == "grid_search":
            problems.append(f"{where}: PBT mutates a value, it does not search a grid; give a list of values")
            continue
        elif isinstance(mutation, Mapping) and len(mutation) == 1:
            problems.append(_unknown_space(where, mutation))
            continue
        else:
            problems.append(
                f"{where}={mutation!r} must be a non-empty list of values or a search space "
                f"({', '.join(s for s in SEARCH_SPACES if s != 'grid_search')})"
            )
            continue
        values_to_check.setdefault((str(key),), []).extend(values)
    return mutations


def _search_alg_args(value: Any, spaces: Spaces, problems: list[str]) -> tuple[str, dict[str, Any]] | None:
    found = _typed_args("search_alg", value, _SEARCH_ALG_ARGS, "optuna", problems)
    if found is None:
        return None
    grids = ["config key " + ".".join(path) for path, (space, _) in spaces.items() if space == "grid_search"]
    if grids:
        problems.append(f"search_alg type optuna cannot search a grid_search ({', '.join(grids)}); use choice: [...]")
    try:
        importlib.import_module("optuna")  # whether it imports: Ray's OptunaSearch needs it whole
    except ImportError as e:
        problems.append(f"search_alg type optuna needs the optuna package ({e}): {install_hint(OPTUNA_EXTRA)}")
    return None if grids else found


def _build_scheduler(args: tuple[str, dict[str, Any]] | None, mutations: dict[str, Any]) -> TrialScheduler | None:
    if args is None or args[0] == "fifo":
        return None
    kind, kwargs = args
    kwargs.setdefault("time_attr", "training_iteration")  # PBT's own default is time_total_s
    if kind == "asha":
        return ASHAScheduler(**kwargs)
    return PopulationBasedTraining(hyperparam_mutations=mutations, **kwargs)


def _build_search_alg(args: tuple[str, dict[str, Any]] | None) -> Searcher | None:
    if args is None:
        return None
    from ray.tune.search.optuna import OptunaSearch

    return OptunaSearch(**args[1])
