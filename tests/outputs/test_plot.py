"""Learning curves from run directories and Tune experiments: groups of seeds as mean ± std, one curve per trial.

Run directories are written by the tests (``params.json`` + ``progress.jsonl``), but for one real
tiny run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flowrl.cli.main import main
from flowrl.errors import RunError, RunWarning
from flowrl.outputs.plot import plot_runs
from flowrl.runs.run import start_run
from flowrl.storage.rundir import RunSpec

pytestmark = pytest.mark.unit

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_run(
    directory: Path,
    algo: str,
    seed: int,
    points: list[tuple[float, float | None]],
    env: str = "CartPole-v1",
    **config: Any,
) -> Path:
    """A run directory whose results have ``timesteps_total`` and ``episode_reward_mean`` (None: NaN,
    written as null)."""
    directory.mkdir(parents=True)
    params = {"algo": algo, "env": env, "config": {"seed": seed, "lr": 0.01, **config}, "stop": {}}
    (directory / "params.json").write_text(json.dumps(params))
    lines = [
        json.dumps(
            {
                "training_iteration": i + 1,
                "timesteps_total": x,
                "episode_reward_mean": y,
                "info": {"learner": {"default_policy": {"loss": 1.0 / (i + 1)}}},
            }
        )
        for i, (x, y) in enumerate(points)
    ]
    (directory / "progress.jsonl").write_text("\n".join(lines) + "\n")
    return directory


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > len(PNG_SIGNATURE)


def test_seeds_of_one_setting_are_one_group(tmp_path: Path) -> None:
    pg0 = write_run(tmp_path / "pg0", "pg", 0, [(100, 10.0), (200, 20.0), (300, 30.0)])
    pg1 = write_run(tmp_path / "pg1", "pg", 1, [(100, 20.0), (200, 40.0), (300, 50.0)])
    ppo = write_run(tmp_path / "ppo", "ppo", 0, [(100, 15.0), (200, 60.0)])

    drawn = plot_runs([pg0, pg1, ppo], out=tmp_path / "curve.png")

    assert_png(tmp_path / "curve.png")
    assert drawn.path == tmp_path / "curve.png" and drawn.curves == 2
    assert [group.runs for group in drawn.groups] == [(pg0, pg1), (ppo,)]
    first, second = drawn.groups
    assert first.label == "pg CartPole-v1 (2 runs)" and second.label == "ppo CartPole-v1 (seed 0)"
    np.testing.assert_array_equal(first.x, [100, 200, 300])
    np.testing.assert_allclose(first.mean, [15, 30, 40])
    np.testing.assert_allclose(first.std, [5, 10, 10])
    np.testing.assert_allclose(second.mean, [15, 60])
    assert not second.std.any()


def test_runs_are_interpolated_onto_the_range_they_all_cover(tmp_path: Path) -> None:
    early = write_run(tmp_path / "a", "pg", 0, [(0, 0.0), (10, 10.0), (20, 20.0)])
    late = write_run(tmp_path / "b", "pg", 1, [(5, 0.0), (15, 0.0), (25, 0.0), (35, 0.0)])
    (group,) = plot_runs([early, late], out=tmp_path / "curve.png").groups
    np.testing.assert_array_equal(
        group.x, [5, 10, 15, 20]
    )  # every x either reports, from 5 (b's first) to 20 (a's last)
    np.testing.assert_allclose(group.mean, [2.5, 5, 7.5, 10])  # a interpolated, b constant
    np.testing.assert_allclose(group.std, [2.5, 5, 7.5, 10])


def test_runs_that_differ_in_more_than_the_seed_are_separate_and_labelled_by_the_difference(tmp_path: Path) -> None:
    slow = write_run(tmp_path / "slow", "ppo", 0, [(1, 1.0), (2, 2.0)], lr=0.001)
    fast = write_run(tmp_path / "fast", "ppo", 0, [(1, 1.0), (2, 3.0)], lr=0.01)
    drawn = plot_runs([slow, fast], out=tmp_path / "curve.svg")
    assert [group.label for group in drawn.groups] == [
        "ppo CartPole-v1 lr=0.001 (seed 0)",
        "ppo CartPole-v1 lr=0.01 (seed 0)",
    ]
    assert (tmp_path / "curve.svg").read_text().lstrip().startswith("<?xml")


def test_nested_keys_and_results_without_a_value(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", "pg", 0, [(100, 1.0), (200, None), (300, 3.0)])
    drawn = plot_runs([run], x="training_iteration", y="info/learner/default_policy/loss", out=tmp_path / "loss.png")
    np.testing.assert_allclose(drawn.groups[0].mean, [1, 1 / 2, 1 / 3])
    drawn = plot_runs([run], out=tmp_path / "reward.png")
    np.testing.assert_array_equal(drawn.groups[0].x, [100, 300])  # the NaN reward (null) is left out


def test_a_tune_experiment_plots_each_trial_labelled_by_its_searched_config(tmp_path: Path) -> None:
    experiment = tmp_path / "tune-ppo"
    experiment.mkdir()
    (experiment / "spec.json").write_text(
        json.dumps(
            {
                "name": "tune-ppo",
                "algo": "ppo",
                "env": "CartPole-v1",
                "metric": "episode_reward_mean",
                "mode": "max",
                "searched": ["lr", "model/fcnet_hiddens"],
            }
        )
    )
    for i, (lr, hiddens) in enumerate(((0.001, [32]), (0.01, [32]), (0.01, [64, 64]))):
        write_run(
            experiment / f"flowrl_ppo_{i:05d}",
            "ppo",
            0,
            [(100, 10.0 * i), (200, 20.0 * i)],
            lr=lr,
            model={"fcnet_hiddens": hiddens},
        )
    (experiment / "trials.csv").write_text("trial_id\n")  # files beside the trials are not trials

    other = write_run(tmp_path / "other", "ppo", 0, [(100, 5.0)])
    drawn = plot_runs([experiment, other], out=tmp_path / "tune.png")

    assert_png(tmp_path / "tune.png")
    assert drawn.curves == 4 and all(len(group.runs) == 1 for group in drawn.groups)
    assert [group.label for group in drawn.groups[:3]] == [
        "lr=0.001, model/fcnet_hiddens=[32]",
        "lr=0.01, model/fcnet_hiddens=[32]",
        "lr=0.01, model/fcnet_hiddens=[64, 64]",
    ]


def test_a_real_run_plots(ray_session: None, tmp_path: Path) -> None:
    spec = RunSpec(
        "pg",
        "CartPole-v1",
        {"num_workers": 0, "train_batch_size": 64, "rollout_fragment_length": 32, "seed": 0},
        stop={"training_iteration": 3},
    )
    with start_run(spec, results_dir=tmp_path) as run:
        run.train()
    drawn = plot_runs([run.directory], x="training_iteration", out=tmp_path / "curve.png")
    assert_png(tmp_path / "curve.png")
    (group,) = drawn.groups
    assert group.runs == (run.directory,)
    np.testing.assert_array_equal(group.x, [1, 2, 3])
    assert np.isfinite(group.mean).all()


def test_bad_input_is_named(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", "pg", 0, [(100, 1.0)])
    with pytest.raises(
        RunError, match=r"--y 'episode_reward_man' is in no result \(keys close to it: episode_reward_mean"
    ):
        plot_runs([run], y="episode_reward_man", out=tmp_path / "curve.png")
    with pytest.raises(
        RunError, match=r"--x 'loss' is in no result \(keys close to it: info/learner/default_policy/loss"
    ):
        plot_runs([run], x="loss", out=tmp_path / "curve.png")
    with pytest.raises(
        RunError, match="is neither a flowrl run directory .* it holds run directories \\(run\\): name them"
    ):
        plot_runs([tmp_path], out=tmp_path / "curve.png")
    with pytest.raises(RunError, match="no such directory"):
        plot_runs([tmp_path / "nowhere"], out=tmp_path / "curve.png")
    with pytest.raises(RunError, match=r"suffix '.txt' is not an image format matplotlib writes \(.*\.png"):
        plot_runs([run], out=tmp_path / "curve.txt")
    empty = write_run(tmp_path / "empty", "pg", 0, [])
    (empty / "progress.jsonl").write_text("")
    with pytest.raises(RunError, match="no results to plot"):
        plot_runs([empty], out=tmp_path / "curve.png")
    assert not (tmp_path / "curve.png").exists()


def test_a_run_without_the_key_is_left_out_with_a_warning(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", "pg", 0, [(100, 1.0), (200, 2.0)])
    no_reward = write_run(tmp_path / "no_reward", "pg", 1, [(100, None)])
    with pytest.warns(RunWarning, match="no_reward is not plotted: none of its results has finite values"):
        drawn = plot_runs([run, no_reward], out=tmp_path / "curve.png")
    assert [group.runs for group in drawn.groups] == [(run,)]
    assert drawn.skipped == (
        (no_reward, "none of its results has finite values of both 'timesteps_total' and 'episode_reward_mean'"),
    )


def test_without_matplotlib_the_extra_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = write_run(tmp_path / "run", "pg", 0, [(100, 1.0)])
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import matplotlib.figure raises ImportError
    with pytest.raises(
        RunError, match=r"plotting needs the optional dependency matplotlib .*pip install 'flowrl-ray\[plot\]'"
    ):
        plot_runs([run], out=tmp_path / "curve.png")


def test_cli_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = [write_run(tmp_path / f"pg{seed}", "pg", seed, [(100, 1.0 + seed), (200, 2.0)]) for seed in range(2)]
    out = tmp_path / "plots" / "curve.png"
    assert main(["plot", *map(str, runs), "--x", "training_iteration", "-o", str(out)]) == 0
    assert_png(out)
    assert capsys.readouterr().out.splitlines() == [
        f"{out}: episode_reward_mean against training_iteration, 1 curve",
        "  pg CartPole-v1 (2 runs)",
    ]
    assert main(["plot", str(runs[0]), "--y", "reward", "-o", str(out)]) == 2
    assert "--y 'reward' is in no result (keys close to it: episode_reward_mean)" in capsys.readouterr().err
