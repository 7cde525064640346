"""Videos of evaluation episodes: ``flowrl evaluate --video``, ``evaluation_video`` in a run, and what
happens without the optional dependencies."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
from fakes import progress

from flowrl import Trainer
from flowrl.actors.evaluation import run_episodes
from flowrl.algorithms import get_algorithm
from flowrl.algorithms.pg import PGConfig
from flowrl.cli import main as cli
from flowrl.envs.video import require_video_dependencies
from flowrl.errors import EnvError
from flowrl.runs.run import start_run
from flowrl.storage.rundir import RunSpec

pytestmark = pytest.mark.unit

moviepy = pytest.importorskip("moviepy", reason="the video extra: pip install 'flowrl-ray[video]'")

PG_TINY = {"num_workers": 0, "train_batch_size": 64, "rollout_fragment_length": 32, "seed": 0}


def frames(path: Path) -> int:
    """How many frames the MP4 file at ``path`` holds, read back with moviepy."""
    clip = moviepy.VideoFileClip(str(path))
    try:
        return sum(1 for _ in clip.iter_frames())
    finally:
        clip.close()


def test_flowrl_evaluate_records_each_episode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ray_session: None
) -> None:
    spec = RunSpec("pg", "CartPole-v1", PG_TINY, stop={"training_iteration": 1})
    with start_run(spec, results_dir=tmp_path) as run:
        run.train()
    videos = tmp_path / "videos"
    assert cli.main(["evaluate", str(run.directory), "--episodes", "2", "--seed", "0", "--video", str(videos)]) == 0
    assert f"videos: {videos}" in capsys.readouterr().out
    files = sorted(videos.glob("*.mp4"))
    assert [f.name for f in files] == ["evaluation-episode-0.mp4", "evaluation-episode-1.mp4"]
    assert all(frames(f) > 0 for f in files)


@pytest.mark.parametrize("evaluation_num_workers", [0, 1])
def test_a_run_writes_one_video_per_evaluation(evaluation_num_workers: int, tmp_path: Path, ray_session: None) -> None:
    config = {
        **PG_TINY,
        "evaluation_interval": 2,
        "evaluation_num_episodes": 1,
        "evaluation_num_workers": evaluation_num_workers,
        "evaluation_video": True,
    }
    spec = RunSpec("pg", "CartPole-v1", config, stop={"training_iteration": 4})
    with start_run(spec, results_dir=tmp_path) as run:
        run.train()
    videos = sorted((run.directory / "videos").iterdir())
    assert [v.name for v in videos] == ["iteration_000002.mp4", "iteration_000004.mp4"]
    results = progress(run.directory)
    for video, result in zip(videos, results[1::2]):
        # The evaluation's episode was recorded: a frame at reset and one per step.
        assert frames(video) == result["evaluation"]["episode_len_mean"] + 1
    # The bytes travel beside the results, never in them.
    assert all(len(json.dumps(r)) < 20_000 for r in results)
    assert run.trainer.evaluator.take_video() is None  # the run took each one


def test_recording_says_what_to_install_when_moviepy_is_missing(
    monkeypatch: pytest.MonkeyPatch, ray_session: None
) -> None:
    monkeypatch.setitem(sys.modules, "moviepy", None)  # what importing an absent package does
    with pytest.raises(
        EnvError, match=r"recording video needs the optional dependency moviepy .*pip install 'flowrl-ray\[video\]'"
    ):
        require_video_dependencies()
    # Asked for in a config, it is reported when the trainer is built, before any training.
    with pytest.raises(EnvError, match=r"pip install 'flowrl-ray\[video\]'"):
        Trainer("pg", "CartPole-v1", {**PG_TINY, "evaluation_interval": 1, "evaluation_video": True})
    # Without it, flowrl trains and evaluates as long as no video is asked for.
    trainer = Trainer("pg", "CartPole-v1", {**PG_TINY, "evaluation_interval": 1, "evaluation_num_episodes": 1})
    try:
        assert trainer.train()["evaluation"]["episodes"] == 1
    finally:
        trainer.stop()


def test_an_env_of_your_own_must_render_frames_to_be_recorded(tmp_path: Path) -> None:
    def make_env(env_config: dict[str, Any]) -> gym.Env:
        return gym.make("CartPole-v1")  # no render_mode

    env = make_env({})
    config = PGConfig.from_dict({})
    policy = get_algorithm("pg").make_policy(env.observation_space, env.action_space, config).build()
    with pytest.raises(EnvError, match="its render_mode is None, not 'rgb_array'.*must pass render_mode='rgb_array'"):
        run_episodes({"default_policy": policy}, make_env, config, [0], video_dir=tmp_path, record=1)
