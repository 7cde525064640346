"""``flowrl record RUN_DIR --episodes N --out DIR``: a trained run's episodes as experience files, refusals that
leave the disk as it was, and an offline algorithm taking the files as its input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from flowrl import Trainer
from flowrl.cli import main as cli
from flowrl.data import SampleBatch, concat_samples
from flowrl.data.offline import METADATA_FILE, ExperienceWriter, OfflineData

pytestmark = [pytest.mark.unit, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory of a tiny PPO run (no Ray) with checkpoints of iterations 1 and 2."""
    results = tmp_path_factory.mktemp("results")
    argv = ["train", "--algo", "ppo", "--env", "CartPole-v1", "--num-workers", "0", "--stop-iters", "2"]
    tiny = ["train_batch_size=200", "sgd_minibatch_size=100", "num_sgd_iter=1", "rollout_fragment_length=200"]
    sets = [flag for item in tiny for flag in ("--set", item)]
    assert cli.main([*argv, *sets, "--checkpoint-freq", "1", "--results-dir", str(results), "--quiet"]) == 0
    [directory] = results.iterdir()
    return directory


def read_all(out: Path) -> SampleBatch:
    data = OfflineData(out)
    return concat_samples(list(data.iter_batches(1_000)))


def test_records_whole_episodes_with_a_one_line_summary(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "recorded"
    assert cli.main(["record", str(run), "--episodes", "5", "--out", str(out), "--seed", "3"]) == 0
    [line] = capsys.readouterr().out.splitlines()
    rows = read_all(out)
    ends = rows[SampleBatch.TERMINATEDS] | rows[SampleBatch.TRUNCATEDS]
    assert ends.sum() == 5 and ends[-1]  # whole episodes only
    ids = rows[SampleBatch.EPS_ID]
    assert (ids[1:] != ids[:-1]).sum() == 4  # one after the other, each contiguous
    mean = rows[SampleBatch.REWARDS].sum() / 5
    assert line.startswith(f"recorded 5 episodes, {rows.count} steps, mean return {mean:.2f} (greedy) of ppo on ")
    assert line.endswith(f"checkpoint_000002: 1 file in {out}")
    metadata = json.loads((out / METADATA_FILE).read_text())
    assert metadata["algorithm"] == "ppo" and metadata["env"] == "CartPole-v1"
    assert metadata["recorded_from"] == {
        "checkpoint": str(run / "checkpoints" / "checkpoint_000002"),
        "episodes": 5,
        "explore": False,
        "seed": 3,
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recorded"]  # no staging directory left behind

    # bc takes them as they are: spaces and columns check out, and it trains on them.
    trainer = Trainer(
        algo="bc",
        env="CartPole-v1",
        config={"input": str(out), "num_workers": 0, "train_batch_size": 32, "timesteps_per_iteration": 64},
    )
    try:
        result = trainer.train()
    finally:
        trainer.stop()
    assert result["timesteps_total"] >= 64


def test_another_checkpoint_exploring_into_a_directory_with_other_files(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes.txt").write_text("kept")
    argv = ["record", str(run), "--checkpoint", "1", "--explore", "--episodes", "2", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    assert "(exploring) of ppo" in capsys.readouterr().out
    assert (tmp_path / "notes.txt").read_text() == "kept"
    metadata = json.loads((tmp_path / METADATA_FILE).read_text())
    assert metadata["recorded_from"]["checkpoint"].endswith("checkpoint_000001")
    assert metadata["recorded_from"]["explore"] is True
    rows = read_all(tmp_path)
    assert (rows[SampleBatch.TERMINATEDS] | rows[SampleBatch.TRUNCATEDS]).sum() == 2


def test_an_out_holding_experiences_is_refused_and_left_alone(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "recorded"
    assert cli.main(["record", str(run), "--episodes", "1", "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert cli.main(["record", str(run), "--episodes", "3", "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert f"flowrl: error: '{out}' already holds experiences" in error and "nothing was overwritten" in error
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_an_error_while_writing_leaves_no_output(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def full_disk(self: ExperienceWriter, *args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ExperienceWriter, "write", full_disk)
    assert cli.main(["record", str(run), "--episodes", "2", "--out", str(tmp_path / "recorded")]) == 2
    error = capsys.readouterr().err
    assert f"flowrl: error: cannot write experiences to '{tmp_path / 'recorded'}'" in error
    assert "No space left on device" in error
    assert list(tmp_path.iterdir()) == []  # neither the output nor the staging directory


def test_a_run_directory_without_checkpoints_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "ppo_CartPole-v1_20250101-120000"
    (run / "checkpoints").mkdir(parents=True)
    assert cli.main(["record", str(run), "--episodes", "5", "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert f"flowrl: error: run directory '{run}' has no complete checkpoint under" in error
    assert not (tmp_path / "out").exists()
    assert cli.main(["record", str(tmp_path / "nothing"), "--episodes", "5", "--out", str(tmp_path / "out")]) == 2
    assert "does not exist or is not a directory" in capsys.readouterr().err


def test_episodes_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["record", "run", "--episodes", "0", "--out", "out"])
    assert exited.value.code == 2
    assert "--episodes" in capsys.readouterr().err


def test_recorded_rows_are_the_policys_greedy_actions(run: Path, tmp_path: Path) -> None:
    """Greedy recording: each row's action is the argmax of the distribution inputs recorded beside it."""
    assert cli.main(["record", str(run), "--episodes", "3", "--out", str(tmp_path / "r")]) == 0
    rows = read_all(tmp_path / "r")
    np.testing.assert_array_equal(rows[SampleBatch.ACTIONS], rows[SampleBatch.ACTION_DIST_INPUTS].argmax(axis=1))


def test_flowrl_help_lists_record(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "record a checkpoint's episodes as experience files" in capsys.readouterr().out
