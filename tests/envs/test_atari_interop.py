"""flowrl's Atari envs as Gymnasium's own tools see them, and a run that leaves no emulator behind at exit."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gymnasium_check_env

from flowrl.envs import make_atari_env

pytestmark = pytest.mark.unit

pytest.importorskip("ale_py")
pytest.importorskip("cv2")


def test_gymnasiums_check_env_passes_and_the_spec_rebuilds_the_same_stack() -> None:
    env = make_atari_env("PongNoFrameskip-v4", noop_max=0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its advice to check the env before wrapping it
            gymnasium_check_env(env)  # also recreates the env from env.spec
        assert env.spec is not None
        wrappers = {spec.name: spec.kwargs for spec in env.spec.additional_wrappers}
        assert wrappers["EpisodicLife"] == {} and wrappers["FireReset"] == {"fire_action": 1}
        again = env.spec.make()
        try:
            assert str(again) == str(env)
            first, _ = env.reset(seed=3)
            second, _ = again.reset(seed=3)
            assert np.array_equal(first, second)
        finally:
            again.close()
    finally:
        env.close()


RUN = textwrap.dedent(
    """
    from flowrl import Trainer
    config = {"num_workers": 0, "num_envs_per_worker": 2, "rollout_fragment_length": 16, "train_batch_size": 32,
              "sgd_minibatch_size": 32, "num_sgd_iter": 1, "env_config": {"repeat_action_probability": 0.0}}
    trainer = Trainer("ppo", "ALE/Pong-v5", config)
    trainer.train()
    trainer.stop()
    print("stopped")
    """
)


@pytest.mark.atari
def test_a_stopped_atari_trainer_leaks_no_emulator_at_exit() -> None:
    """ale-py's envs keep their emulator when closed; nanobind reported each one left at exit (18 lines)."""
    proc = subprocess.run([sys.executable, "-c", RUN], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("stopped"), proc.stderr[-3000:]
    assert "leaked instance" not in proc.stderr, proc.stderr[-3000:]
