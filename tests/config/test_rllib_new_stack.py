"""RLlib 2.x's new-stack key names (EnvRunners, Learners) read as flowrl's keys, each with one note."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any, Iterator

import pytest

from flowrl.algorithms import get_algorithm
from flowrl.config import rllib as rllib_compat
from flowrl.config.rllib import IGNORED, IGNORED_AT, NESTED, NOT_IMPLEMENTED, PER_LEARNER, RENAMED, RLlibConfigNote
from flowrl.errors import ConfigError

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh_notes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test sees the notes as a new process would (each is shown once per process)."""
    monkeypatch.setattr(rllib_compat, "_shown", set())
    yield


def read(algo: str, values: dict[str, Any]) -> tuple[Any, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = get_algorithm(algo).config_class.from_dict(values)
    return config, [str(w.message) for w in caught if w.category is RLlibConfigNote]


@pytest.mark.parametrize(
    ("algo", "rllib_key", "value", "flowrl_key"),
    [
        ("ppo", "num_env_runners", 3, "num_workers"),
        ("ppo", "num_envs_per_env_runner", 4, "num_envs_per_worker"),
        ("ppo", "num_cpus_per_env_runner", 2.0, "num_cpus_per_worker"),
        ("ppo", "num_gpus_per_env_runner", 0.5, "num_gpus_per_worker"),
        ("ppo", "custom_resources_per_env_runner", {"accel": 1.0}, "custom_resources_per_worker"),
        ("dqn", "evaluation_num_env_runners", 2, "evaluation_num_workers"),
        ("ppo", "num_epochs", 5, "num_sgd_iter"),
        ("impala", "num_epochs", 2, "num_sgd_iter"),
        ("ppo", "num_learner_workers", 2, "num_learners"),
        ("ppo", "num_cpus_per_learner_worker", 2.0, "num_cpus_per_learner"),
        ("ppo", "num_gpus_per_learner_worker", 1.0, "num_gpus_per_learner"),
        ("dqn", "num_cpus_for_main_process", 2.0, "num_cpus_for_driver"),
        ("a2c", "restart_failed_env_runners", False, "recreate_failed_workers"),
        ("ppo", "train_batch_size_per_learner", 2000, "train_batch_size"),
        ("ppo", "minibatch_size", 64, "sgd_minibatch_size"),
    ],
)
def test_a_new_stack_key_becomes_flowrls_with_one_note(algo: str, rllib_key: str, value: Any, flowrl_key: str) -> None:
    config, notes = read(algo, {rllib_key: value})
    assert getattr(config, flowrl_key) == value  # num_learners is 0: one learner, so per-learner is the total
    assert len(notes) == 1 and rllib_key in notes[0] and flowrl_key in notes[0], notes


def test_the_keys_a_reviewer_tried_no_longer_meet_misleading_suggestions() -> None:
    """``num_env_runners`` was "did you mean 'num_learners'?", ``num_epochs`` "did you mean 'num_gpus'?"."""
    config, notes = read("ppo", {"num_env_runners": 2, "num_epochs": 3, "num_envs_per_env_runner": 8})
    assert (config.num_workers, config.num_sgd_iter, config.num_envs_per_worker) == (2, 3, 8)
    assert len(notes) == 3


def test_per_learner_sizes_become_totals_over_the_learners_whatever_the_key_order() -> None:
    values = {"train_batch_size_per_learner": 500, "minibatch_size": 100, "num_learners": 2}
    config, notes = read("ppo", values)
    assert (config.train_batch_size, config.sgd_minibatch_size, config.num_learners) == (1000, 200, 2)
    assert [n for n in notes if "train_batch_size_per_learner" in n] == [
        "RLlib key train_batch_size_per_learner=500 is train_batch_size=1000 here: RLlib's counts per learner, "
        "flowrl's train_batch_size is shared by all learners (500 x max(1, num_learners=2))"
    ]
    reversed_config, _ = read("ppo", dict(reversed(values.items())))
    assert reversed_config.train_batch_size == 1000


def test_a_new_stack_key_contradicting_flowrls_or_lacking_in_the_algorithm_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        read("ppo", {"num_env_runners": 2, "num_workers": 3})
    assert "num_env_runners=2 and num_workers=3 both set num_workers; keep one" in str(info.value)
    with pytest.raises(ConfigError, match="RLlib key num_epochs is num_sgd_iter in flowrl, which DQNConfig has no key"):
        read("dqn", {"num_epochs": 2})


def test_new_stack_keys_that_change_nothing_are_listed_in_the_ignored_note() -> None:
    _, notes = read("ppo", {"enable_rl_module_and_learner": True, "ignore_env_runner_failures": True})
    assert len(notes) == 1
    assert "enable_rl_module_and_learner" in notes[0] and "ignore_env_runner_failures" in notes[0]


def test_the_per_learner_table_is_disjoint_from_the_others_and_documented() -> None:
    assert not set(PER_LEARNER) & (set(RENAMED) | set(NESTED) | set(IGNORED) | set(IGNORED_AT) | set(NOT_IMPLEMENTED))
    page = (REPO / "docs" / "coming-from-rllib.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `([\w.]+)`", page, flags=re.MULTILINE))
    assert set(PER_LEARNER) <= documented
