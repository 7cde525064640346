"""Reading result dicts: nested keys as ``a/b`` paths, flattening, and which values are finite numbers.

A training result nests some keys (``info``, ``plan``, ``evaluation``, ``custom_metrics``);
loggers, stop criteria, ``keep_best``, plots and Tune experiments name them as paths such as
``evaluation/episode_reward_mean``, which these helpers resolve the same way everywhere.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

SEPARATOR = "/"  # between the levels of a nested result key


def result_value(result: Mapping[str, Any], key: str) -> Any:
    """``result[key]``, or for a key ``a/b`` the nested ``result["a"]["b"]``; None if there is none."""
    if key in result:
        return result[key]
    value: Any = result
    for part in key.split(SEPARATOR):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def flatten_result(result: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``result`` with nested mappings flattened: ``{"info": {"learner": {...}}}`` -> ``{"info/learner/...": ...}``."""
    flat: dict[str, Any] = {}
    for key, value in result.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_result(value, name + SEPARATOR))
        else:
            flat[name] = value
    return flat


def finite_number(value: Any) -> float | None:
    """``value`` as a float if it is a finite number (Python's or numpy's, not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy's bool is no Real
        return None
    number = float(value)
    return number if math.isfinite(number) else None
