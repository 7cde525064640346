"""Asking for a well-known algorithm flowrl lacks names the built-in ones that serve its purpose."""

from __future__ import annotations

import pytest

from flowrl.algorithms import get_algorithm, list_algorithms
from flowrl.algorithms.registry import NOT_IMPLEMENTED
from flowrl.errors import UnknownAlgorithmError

pytestmark = pytest.mark.unit

MULTI_AGENT = ("mappo", "ippo", "qmix", "maddpg")


def message(name: str) -> str:
    with pytest.raises(UnknownAlgorithmError) as info:
        get_algorithm(name)
    return str(info.value)


def test_sac_is_built_in_and_no_longer_answered_with_other_algorithms() -> None:
    assert "sac" not in NOT_IMPLEMENTED
    assert get_algorithm("SAC").name == "sac"


@pytest.mark.parametrize("name", sorted(NOT_IMPLEMENTED))
def test_each_missing_algorithm_names_built_in_ones_that_fit(name: str) -> None:
    instead = NOT_IMPLEMENTED[name]
    assert instead.use and set(instead.use) <= set(list_algorithms()), instead
    if name in MULTI_AGENT:
        assert all(get_algorithm(use).multi_agent for use in instead.use), instead
    if name not in list_algorithms():
        assert f"use {' or '.join(map(repr, instead.use))} ({instead.why})" in message(name)


def test_a_misspelt_name_keeps_the_spelling_suggestions() -> None:
    assert message("ppoo").startswith("unknown algorithm 'ppoo'; did you mean 'ppo'")
