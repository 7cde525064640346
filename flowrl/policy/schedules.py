"""Piecewise-linear schedules over global timesteps, in RLlib's format: ``[[timestep, value], ...]``.

A schedule (``lr_schedule``, ``entropy_coeff_schedule``) gives a value at every env step sampled
by the run: the first point's value before it, the last point's value after it, and the straight
line between the two points around ``t`` in between. Config fields check theirs with
:func:`schedule_problems` before anything is built.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from typing import Any


class PiecewiseSchedule:
    """``[[t0, v0], [t1, v1], ...]`` (timesteps non-decreasing): linear between points, flat outside them."""

    def __init__(self, points: Sequence[Sequence[float]]) -> None:
        self.timesteps = [float(t) for t, _ in points]
        self.values = [float(v) for _, v in points]

    def value(self, t: float) -> float:
        """The scheduled value at global timestep ``t``."""
        k = bisect.bisect_right(self.timesteps, t)
        if k == 0:
            return self.values[0]
        if k == len(self.timesteps):
            return self.values[-1]
        t0, t1, v0, v1 = self.timesteps[k - 1], self.timesteps[k], self.values[k - 1], self.values[k]
        return v0 + (t - t0) / (t1 - t0) * (v1 - v0)


def schedule_problems(name: str, points: Any) -> list[str]:
    """What is wrong with ``points`` as the schedule of config key ``name`` (None: no schedule), one message each."""
    if points is None:
        return []
    example = f"e.g. {name}=[[0, 0.0005], [1000000, 0.0001]]"
    if not isinstance(points, (list, tuple)) or not points:
        return [f"{name}={points!r} must be a non-empty list of [timestep, value] pairs, {example}"]
    problems = []
    last = -math.inf
    for k, point in enumerate(points):
        shown = f"{name}[{k}]={point!r}"
        numbers = isinstance(point, (list, tuple)) and len(point) == 2
        if not numbers or any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in point):
            problems.append(f"{shown} must be a [timestep, value] pair of numbers, {example}")
            continue
        t, v = point
        if not math.isfinite(t) or t < 0:
            problems.append(f"{shown}: the timestep must be a finite number >= 0")
        elif t < last:
            problems.append(f"{shown}: timesteps must not decrease (the point before is at {last:g})")
        else:
            last = t
        if not math.isfinite(v):
            problems.append(f"{shown}: the value must be finite")
    return problems


#: Each config key a schedule can set, and the key of its schedule.
SCHEDULES = {"lr": "lr_schedule", "entropy_coeff": "entropy_coeff_schedule"}


def scheduled_value(config: Any, key: str, timestep: float) -> float:
    """``config``'s value of ``key`` at global timestep ``timestep``: its schedule's value (``lr_schedule`` for
    ``lr``...) when the config has one, else the key's own value."""
    if key not in SCHEDULES:
        raise ValueError(f"{key!r} has no schedule; the keys with one are {', '.join(SCHEDULES)}")
    points = getattr(config, SCHEDULES[key], None)
    return float(getattr(config, key)) if points is None else PiecewiseSchedule(points).value(timestep)


def ending_schedules(config: Any, changes: Mapping[str, Any]) -> dict[str, Any]:
    """``changes`` to a live config, plus ``None`` for each schedule one of them overrides: a value changed
    live (``Trainer.update_config``, PBT) wins over its schedule from then on, and the config, which
    checkpoints keep, says so."""
    ended = {
        schedule: None
        for key, schedule in SCHEDULES.items()
        if key in changes and schedule not in changes and getattr(config, schedule, None) is not None
    }
    return {**changes, **ended}
