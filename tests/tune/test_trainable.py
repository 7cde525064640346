"""flowrl trainers as Ray Tune trials: their placement groups, run directories, and PBT that
changes hyperparameters of a running trainer (or rebuilds it when a key cannot change live)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ray import tune
from ray.tune.schedulers import PopulationBasedTraining

from flowrl.tune.trainable import RunDirectoryLogger, trainable_for, trial_resources

pytestmark = [pytest.mark.tune, pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(240)]

# One process per trial (no remote workers), 200-step iterations: two trials fit the session's 2 CPUs.
TINY = {
    "num_workers": 0,
    "num_cpus_for_driver": 0.5,
    "train_batch_size": 200,
    "sgd_minibatch_size": 100,
    "num_sgd_iter": 2,
    "rollout_fragment_length": 200,
    "seed": 0,
}


def test_a_trial_asks_tune_for_its_plans_placement_group() -> None:
    factory = trial_resources(
        "impala",
        {
            "num_workers": 2,
            "num_cpus_per_worker": 0.25,
            "num_aggregation_workers": 1,
            "num_cpus_per_aggregator": 0.5,
            "placement_strategy": "SPREAD",
        },
    )
    assert factory.bundles == [
        {"CPU": 1.0},
        {"CPU": 0.25},
        {"CPU": 0.25},
        {"CPU": 0.5},
    ]  # trainable, workers, aggregator
    assert factory.strategy == "SPREAD"
    assert trial_resources("ppo", {"num_workers": 1, "num_cpus_for_driver": 0.5}).bundles == [
        {"CPU": 0.5},
        {"CPU": 1.0},
    ]
    learners = {
        "num_workers": 1,
        "num_learners": 2,
        "num_cpus_per_learner": 2,
    }  # a bundle per learner actor, after the workers'
    assert trial_resources("ppo", learners).bundles == [{"CPU": 1.0}, {"CPU": 1.0}, {"CPU": 2.0}, {"CPU": 2.0}]


def pbt_experiment(tmp_path: Path, mutations: dict[str, Any], name: str, **config: Any) -> list[list[dict[str, Any]]]:
    """Two PPO trials, lr 0.01 and 1e-7, and PBT every 2 iterations for 6; each trial's progress.jsonl.

    PBT ranks the trials by their learning rate (``config/lr``, which every result carries), so
    that which one exploits the other does not depend on a few hundred steps of CartPole.
    """
    # Synchronous PBT: each perturbation waits for both trials, so the exploit happens whichever trial runs ahead.
    scheduler = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=2,
        synch=True,
        hyperparam_mutations=mutations,
        quantile_fraction=0.5,
        resample_probability=1.0,
    )
    tuner = tune.Tuner(
        trainable_for("ppo", "CartPole-v1"),
        param_space={**TINY, **config, "lr": tune.grid_search([0.01, 1e-7])},
        tune_config=tune.TuneConfig(metric="config/lr", mode="max", scheduler=scheduler, reuse_actors=True),
        run_config=tune.RunConfig(
            name=name,
            storage_path=str(tmp_path),
            stop={"training_iteration": 6},
            verbose=0,
            callbacks=[RunDirectoryLogger()],
        ),
    )
    grid = tuner.fit()
    assert not grid.errors
    runs = []
    for trial in grid:
        directory = Path(trial.path)
        assert json.loads((directory / "params.json").read_text())["algo"] == "ppo"  # a flowrl run directory
        runs.append([json.loads(line) for line in (directory / "progress.jsonl").read_text().splitlines()])
    return runs


def exploited(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The results of the trial that started with lr=1e-7 (the one PBT makes exploit the other)."""
    [results] = [r for r in runs if r[0]["config"]["lr"] == 1e-7]
    return results


def test_pbt_exploits_with_a_live_learning_rate_change(tmp_path: Path) -> None:
    runs = pbt_experiment(tmp_path, {"lr": [1e-3, 5e-3]}, "live")
    assert all(r[-1]["training_iteration"] == 6 for r in runs)  # both kept training
    results = exploited(runs)
    changed = next(i for i, r in enumerate(results) if r["config"]["lr"] != 1e-7)
    assert results[changed]["config"]["lr"] in (1e-3, 5e-3)  # the mutated value, in the trial's results
    assert results[changed]["info"]["tune"] == {"config_change": "live"}
    # It went on from the other trial's checkpoint: one more batch on top of the steps that trial had then.
    [donor] = [r for r in runs if r is not results]
    at = results[changed]["training_iteration"] - 1
    assert results[changed]["timesteps_total"] == donor[at - 1]["timesteps_total"] + 200


def test_pbt_rebuilds_the_trainer_for_a_key_that_cannot_change_live(tmp_path: Path) -> None:
    results = exploited(pbt_experiment(tmp_path, {"gamma": [0.97]}, "rebuild", gamma=0.95))
    changed = next(r for r in results if r["config"]["lr"] != 1e-7)
    assert (changed["config"]["lr"], changed["config"]["gamma"]) == (0.01, 0.97)  # the donor's lr, gamma mutated
    assert changed["info"]["tune"] == {"config_change": "rebuilt"}
    assert results[-1]["training_iteration"] == 6


def test_an_actor_reused_for_a_new_trial_starts_it_afresh(tmp_path: Path) -> None:
    tuner = tune.Tuner(
        trainable_for("ppo", "CartPole-v1"),
        param_space={**TINY, "lr": tune.grid_search([0.01, 0.005, 0.002])},  # only a live key differs
        tune_config=tune.TuneConfig(max_concurrent_trials=1, reuse_actors=True),
        run_config=tune.RunConfig(name="reuse", storage_path=str(tmp_path), stop={"training_iteration": 2}, verbose=0),
    )
    grid = tuner.fit()
    firsts = sorted(
        tuple(trial.metrics_dataframe.iloc[0][["timesteps_total", "info/tune/config_change"]]) for trial in grid
    )
    assert firsts == [(200, "initial"), (200, "rebuilt"), (200, "rebuilt")]  # no trial went on from another's weights
