"""Trial names and directories of ``flowrl tune`` (``<algo>_<env>_<index>_<short id>``), and its output off a
terminal (no ANSI colour codes in the trials' lines)."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest

from flowrl.tune.reporting import TrialNames, tune_output

pytestmark = pytest.mark.unit


def trial(trial_id: str, experiment_tag: str) -> Any:
    return SimpleNamespace(trial_id=trial_id, experiment_tag=experiment_tag)


def test_a_trial_is_named_by_algo_env_index_and_short_id_whatever_it_searched() -> None:
    names = TrialNames("ppo", "CartPole-v1")
    grid = trial("a1b2c_00003", "3_lr=0.0001,model/fcnet_hiddens=[64, 64]")
    assert names(grid) == "ppo_CartPole-v1_3_a1b2c"
    values = ",".join(f"key_{i}=0.{i}23456789012345" for i in range(8))  # Optuna's floats: 140 characters and more
    assert names(trial("1f2e3d4c", f"12_{values}")) == "ppo_CartPole-v1_12_1f2e3d4c"
    assert TrialNames("dqn", "ale_py:ALE/Pong-v5")(trial("0a1b2_00000", "0")) == "dqn_ale_py_ALE_Pong-v5_0_0a1b2"
    assert names(trial("9f8e7d6c", "")) == "ppo_CartPole-v1_9f8e7d6c"


def test_off_a_terminal_the_trials_lines_are_printed_without_colour(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_COLOR_PREFIX", raising=False)
    monkeypatch.delenv("RAY_AIR_NEW_OUTPUT", raising=False)
    with tune_output(terminal=False):
        assert os.environ["RAY_COLOR_PREFIX"] == "0" and os.environ["RAY_AIR_NEW_OUTPUT"] == "0"
    assert "RAY_COLOR_PREFIX" not in os.environ and "RAY_AIR_NEW_OUTPUT" not in os.environ
    with tune_output(terminal=True):
        assert "RAY_COLOR_PREFIX" not in os.environ
    monkeypatch.setenv("RAY_COLOR_PREFIX", "1")  # the user's choice stands
    with tune_output(terminal=False):
        assert os.environ["RAY_COLOR_PREFIX"] == "1"
