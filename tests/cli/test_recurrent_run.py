"""The commands around a run work on an LSTM-PPO run and an R2D2 run: training with evaluation,
``flowrl evaluate``, ``flowrl export``, ``flowrl doctor`` and ``flowrl plan`` (in-process through
``flowrl.cli.main``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowrl.cli import main as cli

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(300)]

LSTM = ["model.use_lstm=true", "model.lstm_cell_size=8", "model.max_seq_len=8", "model.fcnet_hiddens=[16]"]
EVALUATION = [
    "evaluation_interval=1",
    "evaluation_num_episodes=2",
    "evaluation_num_workers=1",  # evaluated by an actor, which carries the state as the driver does
]
SETTINGS = [
    "train_batch_size=128",
    "rollout_fragment_length=32",
    "num_envs_per_worker=4",
    "sgd_minibatch_size=64",
    "num_sgd_iter=1",
    *EVALUATION,
    *LSTM,
]
R2D2 = [
    "replay_sequence_length=8",
    "rollout_fragment_length=16",
    "num_envs_per_worker=2",
    "train_batch_size=64",
    "learning_starts=64",
    "timesteps_per_iteration=128",
    "model.lstm_cell_size=8",
    "model.fcnet_hiddens=[16]",
    *EVALUATION,
]


@pytest.mark.parametrize(("algo", "settings", "entries"), [("ppo", SETTINGS, 4), ("r2d2", R2D2, 2)])
def test_evaluate_export_doctor_and_plan_run_on_a_recurrent_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], algo: str, settings: list[str], entries: int
) -> None:
    sets = [arg for setting in settings for arg in ("--set", setting)]
    argv = ["train", "--algo", algo, "--env", "StatelessCartPole-v1", "--num-workers", "0", "--seed", "0"]
    assert cli.main([*argv, "--results-dir", str(tmp_path), "--stop-iters", "2", "--checkpoint-freq", "1", *sets]) == 0
    [run] = [p for p in tmp_path.iterdir() if p.is_dir()]
    results = [json.loads(line) for line in (run / "progress.jsonl").read_text().splitlines()]
    assert [r["evaluation"]["episodes"] for r in results] == [2, 2]  # evaluated with the state threaded through

    capsys.readouterr()
    assert cli.main(["evaluate", str(run), "--episodes", "3", "--seed", "0"]) == 0
    assert "3 episodes, deterministic actions" in capsys.readouterr().out
    assert cli.main(["export", str(run), "--format", "torchscript"]) == 0
    [description] = (run / "exports").rglob("*.pt.json")
    assert [spec["name"] for spec in json.loads(description.read_text())["recurrent_inputs"]] == [
        f"state_in_{k}" for k in range(entries)
    ]
    assert cli.main(["doctor", str(run)]) == 0
    assert cli.main(["plan", str(run)]) == 0
