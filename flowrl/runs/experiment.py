"""Experiment files: the YAML or JSON that names an algorithm, an env, stop criteria and a config.

The layout is that of RLlib's tuned examples (``algo`` or ``run``, ``env``, ``stop``,
``config``; optionally under one experiment name), or a flat mapping of config keys::

    cartpole-ppo:
      run: PPO
      env: CartPole-v1
      stop: {training_iteration: 50}
      config: {lr: 5e-5, num_workers: 1}

:func:`load_experiment_file` reads one into an :class:`Experiment`; ``flowrl train --config``
and the library's callers share it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Mapping, TypedDict

from flowrl.errors import RunError, install_hint
from flowrl.storage.rundir import parse_stop

# Top-level keys of an experiment file besides flat config keys ("run" is RLlib's name for "algo").
EXPERIMENT_KEYS = ("algo", "run", "env", "stop", "config")


class Experiment(TypedDict):
    """An experiment file's contents: ``algo`` and ``env`` (None when the file leaves them to the
    caller), ``stop`` criteria (see :data:`flowrl.storage.rundir.STOP_KEYS`) and ``config`` keys."""

    algo: str | None
    env: str | None
    stop: dict[str, float]
    config: dict[str, Any]


_yaml_loader: Any = None


def _load_yaml(text: str) -> Any:
    """Parse YAML (PyYAML, imported only now) reading ``1e-5`` as a float, as YAML 1.2 does."""
    global _yaml_loader
    import yaml

    if _yaml_loader is None:

        class Loader(yaml.SafeLoader):
            """PyYAML follows YAML 1.1, where a float needs a dot: ``lr: 5e-5`` would be a string."""

        Loader.add_implicit_resolver(
            "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"), list("-+0123456789")
        )
        _yaml_loader = Loader
    return yaml.load(text, Loader=_yaml_loader)  # noqa: S506 - a SafeLoader subclass


def _yaml_problem(error: Exception) -> str:
    problem = getattr(error, "problem", None)
    mark = getattr(error, "problem_mark", None)
    if problem and mark is not None:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(error).split())


def read_experiment_data(path: str | os.PathLike[str]) -> Any:
    """The parsed contents of a YAML (``.yaml``, ``.yml``) or JSON (``.json``) experiment file.

    YAML floats such as ``5e-5`` are floats, as in YAML 1.2. Raises :class:`RunError` naming
    the file and what is wrong with it.
    """
    file = Path(path)
    suffix = file.suffix.lower()
    if suffix not in (".yaml", ".yml", ".json"):
        raise RunError(
            f"experiment file {str(file)!r}: unknown file type {suffix or '(no extension)'!r}; use .yaml, .yml or .json"
        )
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RunError(f"experiment file {str(file)!r}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise RunError(f"experiment file {str(file)!r}: cannot read it ({e})") from None
    if suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise RunError(
                f"experiment file {str(file)!r} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}"
            ) from None
    try:
        import yaml
    except ImportError:
        raise RunError(
            f"experiment file {str(file)!r}: reading YAML needs PyYAML, which flowrl depends on but this "
            f"environment lacks (reinstall flowrl: {install_hint()}); or write the config as .json"
        ) from None
    try:
        return _load_yaml(text)
    except yaml.YAMLError as e:
        raise RunError(f"experiment file {str(file)!r} is not valid YAML: {_yaml_problem(e)}") from None


def load_experiment_file(path: str | os.PathLike[str]) -> Experiment:
    """Read a YAML or JSON experiment file (:func:`read_experiment_data`, then :func:`parse_experiment`).

    Raises :class:`RunError` naming the file and what is wrong with it.
    """
    return parse_experiment(read_experiment_data(path), source=f"experiment file {str(Path(path))!r}")


def parse_experiment(data: Any, source: str = "the config file") -> Experiment:
    """Normalise an experiment's parsed contents (None for an empty file) into an :class:`Experiment`.

    Accepts RLlib's tuned-example layout (``algo`` or ``run``, ``env``, ``stop``, ``config``;
    optionally under one experiment name) and a flat dict of config keys; top-level keys
    that are not experiment keys are config keys. ``source`` names the data in errors
    (:class:`RunError`).
    """
    if data is None:  # an empty file
        data = {}
    if not isinstance(data, Mapping):
        raise RunError(f"{source} must hold a mapping of keys to values, not {type(data).__name__}")
    if len(data) == 1:
        ((name, inner),) = data.items()
        if name not in EXPERIMENT_KEYS and isinstance(inner, Mapping) and set(inner) & set(EXPERIMENT_KEYS):
            data = inner  # {"cartpole-ppo": {"run": "PPO", "env": ..., "config": ...}}
    data = dict(data)
    algo, run = data.pop("algo", None), data.pop("run", None)
    if algo is not None and run is not None and str(algo).lower() != str(run).lower():
        raise RunError(f"{source} names two algorithms: algo={algo!r} and run={run!r}; keep one")
    algo = algo if algo is not None else run
    env = data.pop("env", None)
    for key, value in (("algo", algo), ("env", env)):
        if value is not None and not isinstance(value, str):
            raise RunError(f"{source}: {key} must be a string, got {value!r} ({type(value).__name__})")
    stop = parse_stop(data.pop("stop", None) or {}, source)
    config = data.pop("config", None) or {}
    if not isinstance(config, Mapping):
        raise RunError(f"{source}: config must be a mapping of config keys to values, not {type(config).__name__}")
    both = sorted(set(data) & set(config))
    if both:
        raise RunError(f"{source} sets {', '.join(map(repr, both))} both at the top level and under 'config'; keep one")
    return {"algo": algo, "env": env, "stop": stop, "config": {**data, **config}}
