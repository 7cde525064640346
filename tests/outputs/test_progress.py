"""flowrl.outputs.progress: the live display on a terminal, plain lines elsewhere, --quiet and --verbose."""

from __future__ import annotations

import io
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pytest
from rich.console import Console

from flowrl.cli import main as cli
from flowrl.errors import ConfigError
from flowrl.outputs.progress import ProgressDisplay, format_details, format_iteration, progress_toward_stop

pytestmark = pytest.mark.unit

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
TINY = ["--num-workers", "0", "--set", "train_batch_size=64", "--set", "rollout_fragment_length=32"]


def result(iteration: int, reward: float, **extra: Any) -> dict[str, Any]:
    """A result of an iteration sampling 200 env steps in 2 seconds."""
    return {
        "training_iteration": iteration,
        "timesteps_total": 200 * iteration,
        "episode_reward_mean": reward,
        "time_this_iter_s": 2.0,
        "time_total_s": 2.0 * iteration,
        "info": {"learner": {"default_policy": {"policy_loss": 0.125, "entropy": 0.5}}},
        "num_healthy_workers": 2,
        "num_worker_restarts": 1,
        **extra,
    }


def line(result: Mapping[str, Any], steps: int) -> str:
    return f"line {result['training_iteration']} steps {steps}"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def terminal() -> Console:
    return Console(file=io.StringIO(), force_terminal=True, width=150)


def written(console: Console) -> str:
    """What ``console`` (one of :func:`terminal`'s, or another over a StringIO) has written."""
    return cast(io.StringIO, console.file).getvalue()


def shown(console: Console) -> str:
    return ANSI.sub("", written(console))


def test_the_bar_goes_toward_the_stop_criterion_nearest_to_being_met() -> None:
    stop = {"timesteps_total": 1000, "training_iteration": 10, "episode_reward_mean": 200}
    assert progress_toward_stop(stop, {"timesteps_total": 400, "training_iteration": 2}) == ("timesteps_total", 0.4)
    assert progress_toward_stop(stop, {"timesteps_total": 100, "training_iteration": 5}) == ("training_iteration", 0.5)
    assert progress_toward_stop({"time_total_s": 60}, {"time_total_s": 90}) == ("time_total_s", 1.0)
    assert progress_toward_stop({"episode_reward_mean": 200}, {"episode_reward_mean": 50}) is None  # no total
    assert progress_toward_stop({}, {}) is None


def test_live_display_shows_the_bar_eta_rewards_and_steps_per_second() -> None:
    console, clock = terminal(), Clock()
    display = ProgressDisplay(
        {"timesteps_total": 1000}, format_line=line, console=console, title="pg on CartPole-v1", clock=clock
    )
    assert display.live
    with display:
        for iteration, reward in ((1, 20.0), (2, 30.5), (3, 25.25)):
            clock.now += 10.0
            display.update(result(iteration, reward))
    out = shown(console)
    assert "pg on CartPole-v1" in out and "━" in out
    # 600 of 1000 steps in 30 s: 400 more take 20 s.
    assert "60%  ETA 0:00:20" in out and "timesteps_total 600/1,000  elapsed 0:00:30  steps/s 100" in out
    assert "iteration 3  timesteps 600  reward 25.2  best 30.5 (iteration 2)" in out
    assert "line " not in out  # no per-iteration lines on a terminal unless verbose


def test_live_display_without_a_total_and_before_the_first_iteration() -> None:
    console, clock = terminal(), Clock()
    display = ProgressDisplay(
        {"episode_reward_mean": 200},
        format_line=line,
        console=console,
        clock=clock,
        best=(40.0, 7),
        iteration=7,
        timesteps=1400,
    )
    with display:
        assert "waiting for the first iteration" in shown(console)
        display.update(result(8, 35.0))
    out = shown(console)
    assert "no stop criterion with a total" in out and "ETA -:--:--" in out
    assert "best 40.0 (iteration 7)" in out  # a resumed run's best so far


def test_verbose_on_a_terminal_prints_each_line_and_its_details_above_the_display() -> None:
    console = terminal()
    with ProgressDisplay({"training_iteration": 2}, format_line=line, console=console, verbosity="verbose") as display:
        display.update(result(1, 20.0))
    out = shown(console)
    assert "line 1 steps 200" in out and "learner default_policy: policy_loss 0.125, entropy 0.5" in out


def test_without_a_terminal_each_iteration_is_one_plain_line() -> None:
    console = Console(file=io.StringIO(), width=150)  # a file: not a terminal
    with ProgressDisplay({"timesteps_total": 1000}, format_line=line, console=console, timesteps=200) as display:
        assert not display.live
        display.update(result(2, 20.0))
        display.update(result(3, 30.0))
    assert written(console) == "line 2 steps 200\nline 3 steps 200\n"


def test_verbose_lines_add_the_details_and_quiet_shows_nothing() -> None:
    verbose = Console(file=io.StringIO())
    with ProgressDisplay({}, format_line=line, console=verbose, verbosity="verbose") as display:
        display.update(result(1, 20.0))
    assert written(verbose) == (
        "line 1 steps 200\n"
        "  learner default_policy: policy_loss 0.125, entropy 0.5\n"
        "  counters: num_healthy_workers 2, num_worker_restarts 1\n"
    )
    for console in (Console(file=io.StringIO()), terminal()):
        with ProgressDisplay({"training_iteration": 2}, format_line=line, console=console, verbosity="quiet") as quiet:
            assert not quiet.live
            quiet.update(result(1, 20.0))
        assert written(console) == ""
    with pytest.raises(ConfigError, match="verbosity='loud' must be one of quiet, normal, verbose"):
        ProgressDisplay({}, format_line=line, verbosity=cast(Any, "loud"))


def test_details_show_evaluation_and_custom_metrics_when_a_result_has_them() -> None:
    details = format_details(
        result(
            1,
            20.0,
            evaluation={"episode_reward_mean": 180.0, "episode_len_mean": 180.0},
            custom_metrics={"pole_angle_mean": 0.0123},
        )
    )
    assert "  evaluation: episode_reward_mean 180, episode_len_mean 180" in details
    assert "  custom_metrics: pole_angle_mean 0.0123" in details
    assert format_details({"training_iteration": 1}) == []


def test_the_iteration_line_shows_each_policys_return_in_multi_agent_runs() -> None:
    base = {"training_iteration": 3, "timesteps_total": 600, "episode_reward_mean": 80.0, "time_this_iter_s": 2.0}
    single = format_iteration(base, 600)
    assert "policy" not in single and "steps/s     300" in single
    multi = format_iteration({**base, "policy_reward_mean": {"ppo_policy": 150.25, "dqn_policy": 40.0}}, 600)
    assert multi.startswith(single) and multi.endswith("dqn_policy 40.0 ppo_policy 150.2")


def test_the_iteration_line_shows_faults_once_there_are_any() -> None:
    base = {
        "training_iteration": 3,
        "timesteps_total": 600,
        "time_this_iter_s": 2.0,
        "num_worker_restarts": 0,
        "num_bad_observations": 0,
    }
    assert "restarts" not in format_iteration(base, 600)
    line = format_iteration({**base, "num_worker_restarts": 2, "num_bad_observations": 1}, 600)
    assert line.endswith("restarts 2, bad observations 1")


# --- flowrl train ------------------------------------------------------------------------------------


def train(tmp_path: Path, *extra: str) -> int:
    return cli.main(
        [
            "train",
            "--algo",
            "pg",
            "--env",
            "CartPole-v1",
            "--results-dir",
            str(tmp_path),
            *TINY,
            "--stop-iters",
            "2",
            *extra,
        ]
    )


def test_quiet_prints_only_the_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str], ray_session: None) -> None:
    assert train(tmp_path, "--quiet") == 0
    out = capsys.readouterr().out
    assert "iter " not in out and "training pg" not in out
    assert out.startswith("stopped: training_iteration 2 >= 2\n") and "\nresults: " in out


def test_verbose_prints_each_line_and_its_learner_stats(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ray_session: None
) -> None:
    assert train(tmp_path, "--verbose") == 0
    lines = capsys.readouterr().out.splitlines()
    iteration_lines = [i for i, text in enumerate(lines) if text.startswith("iter ")]
    assert len(iteration_lines) == 2
    assert all(lines[i + 1].startswith("  learner default_policy: policy_loss ") for i in iteration_lines)


def test_quiet_and_verbose_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(["train", "--quiet", "--verbose"])
    assert exited.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_train_on_a_terminal_shows_the_live_display(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, ray_session: None
) -> None:
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert train(tmp_path) == 0
    out = ANSI.sub("", capsys.readouterr().out)
    assert "pg on CartPole-v1" in out and "100%  ETA 0:00:00" in out and "training_iteration 2/2  elapsed" in out
    assert "iter    1" not in out  # the live display instead of the lines
    assert "stopped: training_iteration 2 >= 2" in out
