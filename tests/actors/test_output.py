"""``output``: rollout workers write the rows they sample to Parquet files of their own, with a metadata.json
beside them (issue 36: "a PPO run with output writes >= 50k steps")."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from flowrl import Trainer
from flowrl._version import __version__
from flowrl.data import SampleBatch
from flowrl.data.offline import METADATA_FILE, OfflineData

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(300)]


def test_ppo_workers_write_every_sampled_step_to_their_own_files(tmp_path: Path) -> None:
    out = tmp_path / "experiences"
    config = {
        "num_workers": 2,
        "num_cpus_per_worker": 0.5,  # the test session's Ray has 2 CPUs
        "num_envs_per_worker": 5,
        "rollout_fragment_length": 1_000,
        "train_batch_size": 10_000,
        "sgd_minibatch_size": 10_000,
        "num_sgd_iter": 1,
        "model": {"fcnet_hiddens": [16]},
        "seed": 0,
        "output": str(out),
        "output_max_file_size": 2**17,  # several files per worker
    }
    trainer = Trainer(algo="ppo", env="CartPole-v1", config=config)
    try:
        while (result := trainer.train())["timesteps_total"] < 50_000:
            pass
    finally:
        trainer.stop()  # the workers close their last files
    sampled = result["timesteps_total"]

    files = sorted(out.glob("*.parquet"))
    assert not list(out.glob("*.tmp"))
    writers = {path.name.split("-")[1] for path in files}
    assert writers == {"w001", "w002"}  # straight from the remote workers; the local one samples nothing
    assert len(files) > len(writers)  # past output_max_file_size, a worker starts a new file

    data = OfflineData(out)
    assert data.num_rows == sampled >= 50_000
    for column in (SampleBatch.OBS, SampleBatch.ACTIONS, SampleBatch.REWARDS, SampleBatch.ACTION_LOGP):
        assert column in data.columns
    assert SampleBatch.ADVANTAGES not in data.columns  # rows as sampled, before postprocessing
    assert data.columns[SampleBatch.OBS] == ((4,), "float32")
    rows = pq.read_table(files[0], columns=[SampleBatch.REWARDS, SampleBatch.ACTIONS]).to_pandas()
    assert set(rows[SampleBatch.ACTIONS].unique()) <= {0, 1} and (rows[SampleBatch.REWARDS] == 1.0).all()

    metadata = json.loads((out / METADATA_FILE).read_text())
    assert metadata["algorithm"] == "ppo" and metadata["env"] == "CartPole-v1"
    assert metadata["flowrl_version"] == __version__ and metadata["multi_agent"] is False
    spaces = metadata["policies"]["default_policy"]
    assert spaces["observation_space"]["shape"] == [4] and spaces["action_space"]["n"] == 2


def test_multi_agent_rows_carry_their_policy_and_agent(tmp_path: Path) -> None:
    out = tmp_path / "multi"
    config = {
        "num_workers": 0,
        "rollout_fragment_length": 100,
        "train_batch_size": 400,
        "sgd_minibatch_size": 400,
        "num_sgd_iter": 1,
        "output": str(out),
    }
    trainer = Trainer(algo="ppo", env="MultiAgentCartPole", config=config)
    try:
        trainer.train()
    finally:
        trainer.stop()
    data = OfflineData(out)
    assert data.columns[SampleBatch.POLICY_ID] == ((), "object")
    table = pq.read_table(data.files, columns=[SampleBatch.POLICY_ID, SampleBatch.AGENT_ID])
    assert set(table.column(SampleBatch.POLICY_ID).to_pylist()) == {"default_policy"}
    assert len(set(table.column(SampleBatch.AGENT_ID).to_pylist())) == 4  # MultiAgentCartPole's agents
    assert data.metadata is not None and data.metadata["multi_agent"] is True
    assert data.num_rows >= 400
