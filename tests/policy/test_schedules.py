"""Piecewise schedules: the values between, before and after their points, and the config checks."""

from __future__ import annotations

import pytest

from flowrl.policy.schedules import PiecewiseSchedule, schedule_problems

pytestmark = pytest.mark.unit


def test_a_schedule_is_linear_between_points_and_flat_outside_them() -> None:
    schedule = PiecewiseSchedule([[100, 1.0], [300, 0.0], [300, 5.0], [400, 7.0]])
    assert schedule.value(0) == 1.0
    assert schedule.value(100) == 1.0
    assert schedule.value(150) == pytest.approx(0.75)
    assert schedule.value(299) == pytest.approx(0.005)
    assert schedule.value(300) == 5.0  # a step: the later point of two at one timestep wins from there on
    assert schedule.value(350) == pytest.approx(6.0)
    assert schedule.value(10**9) == 7.0


def test_a_one_point_schedule_is_constant() -> None:
    assert PiecewiseSchedule([[0, 3e-4]]).value(12345) == 3e-4


@pytest.mark.parametrize(
    ("points", "wanted"),
    [
        ([], "non-empty list"),
        (0.1, "non-empty list"),
        ([[0, 1e-3], [10]], "lr_schedule[1]=[10] must be a [timestep, value] pair"),
        ([[0, True]], "pair of numbers"),
        ([[-1, 1e-3]], "lr_schedule[0]=[-1, 0.001]: the timestep must be a finite number >= 0"),
        ([[10, 1e-3], [5, 1e-4]], "timesteps must not decrease (the point before is at 10)"),
        ([[0, float("nan")]], "the value must be finite"),
    ],
)
def test_bad_schedules_are_named_with_what_is_wrong(points: object, wanted: str) -> None:
    problems = schedule_problems("lr_schedule", points)
    assert len(problems) == 1 and wanted in problems[0], problems


def test_no_schedule_and_a_good_one_have_no_problems() -> None:
    assert schedule_problems("lr_schedule", None) == []
    assert schedule_problems("lr_schedule", [[0, 5e-4], [1_000_000, 1e-5]]) == []
