"""off_policy_estimation_methods: the estimators it names, and where it makes sense."""

from __future__ import annotations

import pytest

from flowrl.algorithms.marwil import BCConfig
from flowrl.algorithms.ppo import PPOConfig
from flowrl.errors import ConfigError

pytestmark = pytest.mark.unit


def test_an_offline_run_takes_any_of_the_estimators() -> None:
    config = BCConfig.from_dict({"input": "data/", "off_policy_estimation_methods": ["is", "wis", "dm", "dr"]})
    assert config.off_policy_estimation_methods == ["is", "wis", "dm", "dr"]
    assert BCConfig.from_dict({}).off_policy_estimation_methods == []


def test_unknown_or_repeated_estimators_are_named_with_the_valid_ones() -> None:
    with pytest.raises(
        ConfigError, match=r"unknown estimator\(s\) \['snis'\]; the estimators are \['is', 'wis', 'dm', 'dr'\]"
    ):
        BCConfig.from_dict({"input": "data/", "off_policy_estimation_methods": ["wis", "snis"]})
    with pytest.raises(ConfigError, match=r"\['is', 'is'\] names an estimator twice"):
        BCConfig.from_dict({"input": "data/", "off_policy_estimation_methods": ["is", "is"]})


def test_estimators_need_recorded_input_and_evaluations() -> None:
    with pytest.raises(ConfigError, match=r"estimates the policy's value on recorded episodes, but input='sampler'"):
        PPOConfig.from_dict({"off_policy_estimation_methods": ["wis"]})
    with pytest.raises(ConfigError, match="evaluation_interval=0 never evaluates"):
        BCConfig.from_dict({"input": "data/", "evaluation_interval": 0, "off_policy_estimation_methods": ["dr"]})
    assert PPOConfig.from_dict({"off_policy_estimation_methods": []}).off_policy_estimation_methods == []
