"""Search spaces in an experiment's config: parsing them into Tune's objects, and checking the values they take.

A search space is a one-key mapping whose key is one of :data:`SEARCH_SPACES` (``{grid_search: [...]}``,
``{choice: [...]}``, ``{uniform: [lo, hi]}``, ...), anywhere in ``config`` (inside dict values too).
:func:`_search_spaces` swaps each for Tune's object and records the values it can take;
:func:`_value_problems` checks those against the algorithm's config class. :mod:`flowrl.tune.spec`
reads the rest of an experiment file.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import keyword
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

from ray import tune

from flowrl.config import TrainerConfig
from flowrl.errors import ConfigError

#: The search spaces a config value may be, and what each takes.
SEARCH_SPACES = {
    "grid_search": "a non-empty list: every value, each in its own trials",
    "choice": "a non-empty list: one value drawn per trial",
    "uniform": "[lo, hi]: a float drawn uniformly",
    "loguniform": "[lo, hi] with 0 < lo: a float drawn uniformly in log space",
    "randint": "[lo, hi]: an int with lo <= x < hi",
    "quniform": "[lo, hi, q]: a float drawn uniformly, rounded to a multiple of q",
}


def _number_problem(
    where: str,
    value: Any,
    *,
    integer: bool = False,
    above: float | None = None,
    at_least: float | None = None,
    at_most: float | None = None,
) -> str | None:
    """Why ``value`` (shown as ``where=value``) is not a number in the given range, or None."""
    kind = "an int" if integer else "a number"
    bounds = [
        f"> {above:g}" if above is not None else "",
        f">= {at_least:g}" if at_least is not None else "",
        f"<= {at_most:g}" if at_most is not None else "",
    ]
    wanted = " ".join([kind, " and ".join(b for b in bounds if b)]).strip()
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not is_number or (integer and not isinstance(value, int)) or not math.isfinite(value):
        return f"{where}={value!r} must be {wanted}"
    if (
        (above is not None and not value > above)
        or (at_least is not None and value < at_least)
        or (at_most is not None and value > at_most)
    ):
        return f"{where}={value!r} must be {wanted}"
    return None


def _space_name(value: Any) -> str | None:
    """The search space ``value`` is (``{"grid_search": [...]}`` -> ``"grid_search"``), or None."""
    if isinstance(value, Mapping) and len(value) == 1:
        (key,) = value
        if key in SEARCH_SPACES:
            return str(key)
    return None


def _unknown_space(where: str, value: Mapping[str, Any]) -> str:
    (key,) = value
    close = difflib.get_close_matches(str(key), list(SEARCH_SPACES), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown search space {key!r} for {where}; {hint}valid: {', '.join(SEARCH_SPACES)}"


def _domain(where: str, space: str, args: Any, problems: list[str]) -> tuple[Any, list[Any]] | None:
    """Tune's object for ``{space: args}`` at ``where``, and the values to check it can take (None if invalid)."""
    shown = f"{where}: {space} takes {SEARCH_SPACES[space]}, got {args!r}"
    if space in ("grid_search", "choice"):
        if not isinstance(args, list) or not args:
            problems.append(shown)
            return None
        return (tune.grid_search(args) if space == "grid_search" else tune.choice(args)), list(args)
    size = 3 if space == "quniform" else 2
    integer = space == "randint"
    numbers = (
        isinstance(args, list)
        and len(args) == size
        and all(_number_problem("", x, integer=integer) is None for x in args)
    )
    if (
        not numbers
        or not args[0] < args[1]
        or (space == "loguniform" and args[0] <= 0)
        or (space == "quniform" and args[2] <= 0)
    ):
        problems.append(shown)
        return None
    lo, hi = args[0], args[1]
    if space == "uniform":
        return tune.uniform(lo, hi), [lo, hi]
    if space == "loguniform":
        return tune.loguniform(lo, hi), [lo, hi]
    if space == "randint":
        return tune.randint(lo, hi), [lo, hi - 1]
    return tune.quniform(lo, hi, args[2]), [lo, hi]


def _config_keys(config_class: type[TrainerConfig]) -> dict[str, Any]:
    """The config keys of ``config_class`` (as a file names them: ``lambda``, not ``lambda_``) and their annotations."""
    hints = typing.get_type_hints(config_class)
    keys = {}
    for field in dataclasses.fields(config_class):
        name = field.name[:-1] if field.name.endswith("_") and keyword.iskeyword(field.name[:-1]) else field.name
        keys[name] = hints[field.name]
    return keys


def _takes_dicts(annotation: Any) -> bool:
    """Whether a config key annotated ``annotation`` takes a dict (``dict[...]``, ``Any`` or a union with one)."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    alternatives = typing.get_args(annotation) if union else (annotation,)
    return any(alt is Any or alt is dict or typing.get_origin(alt) is dict for alt in alternatives)


Spaces = dict[tuple[str, ...], tuple[str, list[Any]]]


def _search_spaces(
    config: Mapping[str, Any], config_class: type[TrainerConfig] | None, prefix: tuple[str, ...], problems: list[str]
) -> tuple[dict[str, Any], Spaces]:
    """``config`` with Tune's objects for its search spaces, and ``{path: (space, values to check)}`` of each.

    Mappings inside a dict-valued key are searched too. A one-key mapping on a key that takes
    no dicts is a search space or a mistake: its problem names the valid search spaces.
    """
    keys = _config_keys(config_class) if config_class is not None and not prefix else {}
    param_space: dict[str, Any] = {}
    spaces: Spaces = {}
    for key, value in config.items():
        path = (*prefix, str(key))
        where = f"config key {'.'.join(path)}"
        space = _space_name(value)
        if space is not None:
            built = _domain(where, space, value[space], problems)
            if built is not None:
                param_space[key] = built[0]
                spaces[path] = (space, built[1])
        elif isinstance(value, Mapping) and (prefix or key not in keys or _takes_dicts(keys[key])):
            param_space[key], inner = _search_spaces(value, config_class, path, problems)
            spaces.update(inner)
        elif isinstance(value, Mapping) and len(value) == 1:
            problems.append(_unknown_space(where, value))
        else:
            param_space[key] = value
    return param_space, spaces


def _with_value(config: Mapping[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """A copy of ``config`` with ``path`` (a key, or keys into nested dicts) set to ``value``."""
    copied = dict(config)
    copied[path[0]] = value if len(path) == 1 else _with_value(copied.get(path[0]) or {}, path[1:], value)
    return copied


#: Up to this many grid points, every combination of grid values is checked (a larger grid: each value alone).
MAX_GRID_CHECKED = 256


def _value_problems(
    config_class: type[TrainerConfig],
    param_space: Mapping[str, Any],
    values_to_check: Mapping[tuple[str, ...], list[Any]],
    grids: set[tuple[str, ...]],
) -> list[str]:
    """The config class's problems with the configs that the searched keys' values give.

    Each value is checked with every other searched key at its first value (the first grid
    point, the lower bound), and every combination of the ``grids``' values (which all run) when
    there are at most :data:`MAX_GRID_CHECKED`; other combinations are checked when Tune makes their trial.
    """
    first = dict(param_space)
    for path, values in values_to_check.items():
        first = _with_value(first, path, values[0])
    configs = [_with_value(first, path, value) for path, values in values_to_check.items() for value in values[1:]]
    grid_paths = [path for path in values_to_check if path in grids]
    if math.prod(len(values_to_check[path]) for path in grid_paths) <= MAX_GRID_CHECKED:
        for point in itertools.product(*(values_to_check[path] for path in grid_paths)):
            config = first
            for path, value in zip(grid_paths, point):
                config = _with_value(config, path, value)
            configs.append(config)
    problems: list[str] = []
    for config in [first, *configs]:
        try:
            config_class.from_dict(config)
        except ConfigError as e:
            problems += e.problems
    return problems
