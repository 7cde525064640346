"""Experiment specs for ``flowrl tune``: search spaces, schedulers and search algorithms become Tune's
objects, and every bad spec is one ConfigError naming the key, before Ray starts."""

from __future__ import annotations

import importlib.util
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import ray
import yaml
from ray.tune.schedulers import ASHAScheduler, PopulationBasedTraining
from ray.tune.search.sample import Categorical, Float, Integer, LogUniform, Quantized

from flowrl.algorithms import get_algorithm, list_algorithms
from flowrl.errors import ConfigError, RunError, RunWarning, install_hint
from flowrl.tune import TuneSpec, load_spec, parse_spec

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_ray_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parsing a spec must not start Ray: every test here fails if it tries."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("parsing a spec started Ray")

    monkeypatch.setattr(ray, "init", refuse)


def ppo(config: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    return {"algo": "ppo", "env": "CartPole-v1", "config": config or {}, **top}


def problems(data: Any) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_spec(data)
    return caught.value.problems


def test_search_spaces_become_tune_domains_nested_ones_too() -> None:
    spec = parse_spec(
        ppo(
            {
                "lr": {"grid_search": [0.01, 0.001]},
                "gamma": {"uniform": [0.9, 0.99]},
                "entropy_coeff": {"loguniform": [1e-4, 1e-2]},
                "num_sgd_iter": {"randint": [1, 5]},
                "clip_param": {"quniform": [0.1, 0.3, 0.05]},
                "model": {"fcnet_hiddens": {"choice": [[32, 32], [64, 64]]}, "fcnet_activation": "tanh"},
                "env_config": {
                    "max_steps": {"horizon": 100}
                },  # in a dict value, a one-key dict that is no search space stays
                "num_workers": 0,
            }
        )
    )
    space = spec.param_space
    assert space["lr"] == {"grid_search": [0.01, 0.001]}
    assert isinstance(space["gamma"], Float) and (space["gamma"].lower, space["gamma"].upper) == (0.9, 0.99)
    assert isinstance(space["entropy_coeff"].get_sampler(), LogUniform)
    assert isinstance(space["num_sgd_iter"], Integer)
    assert (space["num_sgd_iter"].lower, space["num_sgd_iter"].upper) == (1, 5)
    assert isinstance(space["clip_param"].get_sampler(), Quantized) and space["clip_param"].get_sampler().q == 0.05
    assert isinstance(space["model"]["fcnet_hiddens"], Categorical)
    assert space["model"]["fcnet_hiddens"].categories == [[32, 32], [64, 64]]
    assert space["model"]["fcnet_activation"] == "tanh"
    assert space["env_config"] == {"max_steps": {"horizon": 100}}
    assert space["num_workers"] == 0
    assert spec.searched == ("lr", "gamma", "entropy_coeff", "num_sgd_iter", "clip_param", "model/fcnet_hiddens")


def test_defaults_and_the_named_tuned_example_layout() -> None:
    spec = parse_spec(
        {
            "cartpole-grid": {
                "run": "PPO",
                "env": "CartPole-v1",
                "stop": {"training_iteration": 3},
                "config": {"lr": {"grid_search": [0.01]}},
            }
        }
    )
    assert (spec.name, spec.algo, spec.env) == ("cartpole-grid", "ppo", "CartPole-v1")
    assert spec.stop == {"training_iteration": 3}
    assert (spec.num_samples, spec.metric, spec.mode) == (1, "episode_reward_mean", "max")
    assert spec.max_concurrent_trials is None
    assert (spec.scheduler, spec.search_alg, spec.checkpoint_freq, spec.keep_checkpoints) == (None, None, 10, 5)
    assert parse_spec(ppo(num_workers=0)).param_space == {"num_workers": 0}  # flat config keys at the top level
    settings = parse_spec(
        ppo(
            num_samples=4,
            metric="timesteps_total",
            mode="min",
            max_concurrent_trials=2,
            checkpoint_freq=0,
            keep_checkpoints=None,
            scheduler="fifo",
        )
    )
    assert (settings.num_samples, settings.metric, settings.mode) == (4, "timesteps_total", "min")
    assert settings.max_concurrent_trials == 2
    assert (settings.checkpoint_freq, settings.keep_checkpoints, settings.scheduler) == (0, None, None)


def test_asha_is_built_with_its_arguments_and_counts_iterations_by_default() -> None:
    spec = parse_spec(ppo(scheduler={"type": "asha", "grace_period": 2, "max_t": 8, "reduction_factor": 2}))
    assert isinstance(spec.scheduler, ASHAScheduler)
    assert spec.scheduler._time_attr == "training_iteration"
    assert (spec.scheduler._reduction_factor, spec.scheduler._max_t) == (2, 8)


def test_pbt_is_built_with_its_mutations_as_tune_takes_them() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", RunWarning)  # lr and entropy_coeff change live: no warning
        spec = parse_spec(
            ppo(
                scheduler={
                    "type": "pbt",
                    "perturbation_interval": 2,
                    "quantile_fraction": 0.5,
                    "resample_probability": 1.0,
                    "hyperparam_mutations": {
                        "lr": {"loguniform": [1e-4, 1e-2]},
                        "entropy_coeff": [0.0, 0.01],
                        "clip_param": {"choice": [0.1, 0.2]},
                    },
                }
            )
        )
    assert spec.is_pbt and isinstance(spec.scheduler, PopulationBasedTraining)
    mutations = spec.scheduler._hyperparam_mutations
    assert isinstance(mutations["lr"].get_sampler(), LogUniform)
    assert mutations["entropy_coeff"] == [0.0, 0.01]
    assert mutations["clip_param"] == [0.1, 0.2]  # PBT perturbs a list's values by moving to a neighbour
    assert (spec.scheduler._time_attr, spec.scheduler._perturbation_interval) == ("training_iteration", 2)
    assert spec.scheduler._metric is None  # Tune's TuneConfig gives it the experiment's metric and mode
    assert spec.searched == ("lr", "entropy_coeff", "clip_param")


def test_pbt_mutating_a_key_that_cannot_change_live_is_allowed_with_a_warning() -> None:
    with pytest.warns(RunWarning, match=r"PBT mutates gamma, which a running ppo trainer cannot change.*lr"):
        spec = parse_spec(ppo(scheduler={"type": "pbt", "hyperparam_mutations": {"gamma": [0.95, 0.99]}}))
    assert spec.scheduler._hyperparam_mutations == {"gamma": [0.95, 0.99]}


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            {"lr": {"normal": [0, 1]}},
            "unknown search space 'normal' for config key lr; did you mean 'uniform'? "
            "valid: grid_search, choice, uniform, loguniform, randint, quniform",
        ),
        ({"lr": {"grid_search": 0.01}}, "config key lr: grid_search takes a non-empty list"),
        ({"lr": {"grid_search": []}}, "config key lr: grid_search takes a non-empty list"),
        ({"lr": {"choice": "0.01"}}, "config key lr: choice takes a non-empty list"),
        ({"lr": {"uniform": [0.1, 0.01]}}, "config key lr: uniform takes [lo, hi]"),
        ({"lr": {"uniform": ["a", 1]}}, "config key lr: uniform takes [lo, hi]"),
        ({"lr": {"uniform": [0.1]}}, "config key lr: uniform takes [lo, hi]"),
        ({"lr": {"loguniform": [0, 0.1]}}, "config key lr: loguniform takes [lo, hi] with 0 < lo"),
        ({"num_sgd_iter": {"randint": [1.5, 3]}}, "config key num_sgd_iter: randint takes [lo, hi]: an int"),
        ({"clip_param": {"quniform": [0.1, 0.3, 0]}}, "config key clip_param: quniform takes [lo, hi, q]"),
        ({"model": {"fcnet_hiddens": {"choice": 64}}}, "config key model.fcnet_hiddens: choice takes a non-empty list"),
        ({"lrr": {"grid_search": [0.1]}}, "unknown config key 'lrr'; did you mean 'lr'?"),
        ({"gamma": {"grid_search": [0.9, 1.5]}}, "gamma=1.5 must be <= 1"),  # every grid value is checked
        ({"entropy_coeff": {"uniform": [-1.0, 0.1]}}, "entropy_coeff=-1.0 must be >= 0"),  # both bounds are
        # Each value is fine with the other grid's first value; one combination of the two grids is not.
        (
            {"train_batch_size": {"grid_search": [1000, 200]}, "sgd_minibatch_size": {"grid_search": [100, 500]}},
            "sgd_minibatch_size=500 > train_batch_size=200",
        ),
    ],
)
def test_a_bad_search_space_is_a_config_error_naming_the_key(config: dict[str, Any], expected: str) -> None:
    found = problems(ppo(config))
    assert any(expected in problem for problem in found), found


@pytest.mark.parametrize(
    ("top", "expected"),
    [
        ({"scheduler": {"type": "hyperband"}}, "scheduler.type='hyperband' must be one of fifo, asha, pbt"),
        (
            {"scheduler": {"type": "asha", "grace": 1}},
            "scheduler type asha has no argument 'grace'; valid: time_attr, max_t",
        ),
        (
            {"scheduler": {"type": "asha", "metric": "episode_reward_mean"}},
            "scheduler.metric: set metric at the top level",
        ),
        (
            {"scheduler": {"type": "asha", "max_t": 2, "grace_period": 4}},
            "scheduler.grace_period=4 > scheduler.max_t=2",
        ),
        ({"scheduler": {"type": "asha", "time_attr": "iterations"}}, "scheduler.time_attr='iterations' must be one of"),
        ({"scheduler": {"type": "pbt"}}, "scheduler type pbt needs hyperparam_mutations"),
        (
            {"scheduler": {"type": "pbt", "perturbation_interval": 0, "hyperparam_mutations": {"lr": [0.1]}}},
            "scheduler.perturbation_interval=0 must be a number > 0",
        ),
        (
            {"scheduler": {"type": "pbt", "quantile_fraction": 0.7, "hyperparam_mutations": {"lr": [0.1]}}},
            "scheduler.quantile_fraction=0.7 must be a number >= 0 and <= 0.5",
        ),
        (
            {"scheduler": {"type": "pbt", "hyperparam_mutations": {"lrr": [0.1]}}},
            "scheduler.hyperparam_mutations.lrr: 'lrr' is not a config key of ppo; did you mean 'lr'?",
        ),
        (
            {"scheduler": {"type": "pbt", "hyperparam_mutations": {"lr": {"grid_search": [0.1]}}}},
            "scheduler.hyperparam_mutations.lr: PBT mutates a value, it does not search a grid",
        ),
        (
            {"scheduler": {"type": "pbt", "hyperparam_mutations": {"lr": {"normal": [0.1]}}}},
            "unknown search space 'normal' for scheduler.hyperparam_mutations.lr",
        ),
        (
            {"scheduler": {"type": "pbt", "hyperparam_mutations": {"lr": 0.1}}},
            "scheduler.hyperparam_mutations.lr=0.1 must be a non-empty list of values or a search space",
        ),
        (
            {"scheduler": {"type": "pbt", "hyperparam_mutations": {"entropy_coeff": [0.0, -1.0]}}},
            "entropy_coeff=-1.0 must be >= 0",
        ),
        (
            {"scheduler": {"type": "pbt", "hyperparam_mutations": {"lr": [0.1]}}, "search_alg": {"type": "optuna"}},
            "search_alg cannot be used with scheduler type pbt",
        ),
        ({"search_alg": {"type": "hyperopt"}}, "search_alg.type='hyperopt' must be one of optuna"),
        ({"search_alg": {"type": "optuna", "seed": "x"}}, "search_alg.seed='x' must be an int >= 0"),
        (
            {"stop": {"episode_reward": 100}},
            "unknown stop criterion 'episode_reward'; did you mean 'episode_reward_mean'?",
        ),
        ({"mode": "maximum"}, "mode='maximum' must be 'max' or 'min'"),
        ({"metric": ""}, "metric='' must be a result key"),
        ({"num_samples": 0}, "num_samples=0 must be an int >= 1"),
        ({"max_concurrent_trials": 1.5}, "max_concurrent_trials=1.5 must be an int >= 1"),
        ({"num_sample": 4}, "unknown key 'num_sample'; did you mean 'num_samples'?"),
        ({"algo": None}, "names no algorithm: add algo (or run)"),
        ({"algo": "ppoo"}, "unknown algorithm 'ppoo'; did you mean 'ppo'"),
        ({"env": None}, "names no env: add env"),
    ],
)
def test_a_bad_setting_is_a_config_error_naming_the_key(top: dict[str, Any], expected: str) -> None:
    found = problems({**ppo(), **top})
    assert any(expected in problem for problem in found), found


def test_every_problem_is_reported_at_once() -> None:
    found = problems(
        ppo(
            {"lr": {"normal": [0, 1]}, "gamma": {"grid_search": 0.9}},
            mode="best",
            scheduler={"type": "pbt", "hyperparam_mutations": {"lrr": [0.1]}},
        )
    )
    assert len(found) == 4, found


def test_optuna_searches_no_grid_and_is_an_optional_dependency() -> None:
    found = problems(ppo({"lr": {"grid_search": [0.1, 0.01]}}, search_alg={"type": "optuna"}))
    assert any("search_alg type optuna cannot search a grid_search (config key lr); use choice" in p for p in found), (
        found
    )
    if importlib.util.find_spec("optuna") is None:
        assert any("pip install 'flowrl-ray[tune-optuna]'" in p for p in problems(ppo(search_alg="optuna"))), found
    else:
        from ray.tune.search.optuna import OptunaSearch

        spec = parse_spec(ppo({"lr": {"loguniform": [1e-4, 1e-2]}}, search_alg={"type": "optuna", "seed": 0}))
        assert isinstance(spec.search_alg, OptunaSearch)


@pytest.mark.parametrize("example", ["tune-cartpole-ppo-grid.yaml", "tune-cartpole-ppo-pbt.yaml"])
def test_the_tuned_examples_parse(example: str) -> None:
    spec = load_spec(REPO / "tuned_examples" / example)
    assert (spec.algo, spec.env, spec.metric) == ("ppo", "CartPole-v1", "episode_reward_mean")
    assert spec.param_space["lr"]["grid_search"]
    assert spec.is_pbt == ("pbt" in example)


def test_a_file_reads_like_a_tuned_example_and_an_unreadable_one_is_a_run_error(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text("grid:\n  algo: pg\n  env: CartPole-v1\n  config:\n    lr: {grid_search: [1e-3, 1e-4]}\n")
    spec = load_spec(path)
    # 1e-3 is a float, as YAML 1.2 reads it (and flowrl train --config).
    assert (spec.name, spec.param_space) == ("grid", {"lr": {"grid_search": [1e-3, 1e-4]}})
    assert isinstance(spec, TuneSpec) and spec.source == {
        "algo": "pg",
        "env": "CartPole-v1",
        "stop": {},
        "config": {"lr": {"grid_search": [1e-3, 1e-4]}},
    }
    path.write_text("algo: pg\n  env: [\n")
    with pytest.raises(RunError, match="is not valid YAML"):
        load_spec(path)
    with pytest.raises(RunError, match="no such file"):
        load_spec(tmp_path / "missing.yaml")


def test_the_pages_experiments_parse_and_its_live_keys_match_the_algorithms() -> None:
    page = (REPO / "docs" / "tune.md").read_text(encoding="utf-8")
    experiments = [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", page, re.DOTALL)]
    for data in (d for d in experiments if "algo" in d):
        if "normal" in str(data):  # the page's example of a bad file
            assert len(problems(data)) == 3
        elif "search_alg" in data and importlib.util.find_spec("optuna") is None:
            assert problems(data) == [
                "search_alg type optuna needs the optuna package (No module named 'optuna'): "
                + install_hint("tune-optuna")
            ]
        else:
            parse_spec(data)
    table = page.split("| algorithm | keys it changes live |")[1]
    rows = re.findall(r"^\| ([a-z0-9_, ]+) \| ([a-z_, ]+) \|$", table, re.MULTILINE)
    named = {name: set(keys.split(", ")) for names, keys in rows if names != "others" for name in names.split(", ")}
    for name in list_algorithms():
        assert set(get_algorithm(name).live_keys) == named.get(name, set()), name
