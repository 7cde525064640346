"""Checkpoints of large replay buffers: rows streamed to the checkpoint's files, never copied whole in memory.

A DQN trainer's local buffer and an Ape-X trainer's two shards are filled directly with 1 GiB each of
Atari-sized rows (``uint8[84, 84, 4]``, row ``i`` filled with ``i % 251``); a sampling thread watches
the resident memory of the driver and of each shard process while ``Trainer.save`` runs. A restore
must replay exactly what the saved buffer would have (rows, priorities and random state alike).
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import ray

from flowrl import Trainer
from flowrl.data import DEFAULT_POLICY_ID, ReplayBufferError, SampleBatch
from flowrl.errors import ReplayShardError
from flowrl.storage.checkpoints import STATE_FILE, read_checkpoint, write_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(240)]

GIB = 1 << 30
OBS_SHAPE = (84, 84, 4)
ROW_BYTES = int(np.prod(OBS_SHAPE)) + 8 + 4  # obs, t (int64), rewards (float32)
ROWS_PER_GIB = GIB // ROW_BYTES
#: The most a save may add to any one process's resident memory (the issue's bound).
SAVE_GROWTH_BOUND = GIB // 4
CALL_TIMEOUT_S = 60


class PeakRss:
    """The largest growth of each process's resident memory while the block runs (sampled every 10 ms)."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.processes = [psutil.Process(pid) for pid in pids]
        self.growth: list[int] = []
        self._stop = threading.Event()

    def _sample(self, baseline: list[int]) -> None:
        while True:
            for i, process in enumerate(self.processes):
                self.growth[i] = max(self.growth[i], process.memory_info().rss - baseline[i])
            if self._stop.wait(0.01):
                return

    def __enter__(self) -> PeakRss:
        baseline = [process.memory_info().rss for process in self.processes]
        self.growth = [0] * len(self.processes)
        self._thread = threading.Thread(target=self._sample, args=(baseline,), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def atari_rows(start: int, count: int) -> SampleBatch:
    index = np.arange(start, start + count)
    obs = np.broadcast_to((index % 251).astype(np.uint8)[:, None, None, None], (count, *OBS_SHAPE))
    return SampleBatch(obs=obs, t=index.astype(np.int64), rewards=(index % 7).astype(np.float32))


def batches(rows: int, size: int = 2048) -> Iterator[SampleBatch]:
    for start in range(0, rows, size):
        yield atari_rows(start, min(size, rows - start))


def priorities(rows: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    index = np.arange(0, rows, 3)
    return {DEFAULT_POLICY_ID: (index, (index % 13).astype(np.float64))}


def assert_same_replay(saved: Any, restored: Any) -> None:
    """Two replays of the same buffer state: equal rows, indexes and weights; rows hold their own number."""
    assert isinstance(saved, SampleBatch) and isinstance(restored, SampleBatch)
    assert set(saved) == set(restored)
    for key in saved:
        np.testing.assert_array_equal(saved[key], restored[key])
    assert (saved["obs"][:, 0, 0, 0] == saved["t"] % 251).all() and (saved["obs"] == saved["obs"][:, :1, :1, :1]).all()
    assert len(np.unique(saved["weights"])) > 1  # the priorities set before the save came back


@pytest.fixture
def checkpoints(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)  # gigabytes: not kept for later sessions


DQN = {
    "num_workers": 0,
    "buffer_size": ROWS_PER_GIB,
    "learning_starts": 1,
    "train_batch_size": 64,
    "prioritized_replay": True,
    "store_buffer_in_checkpoints": True,
    "seed": 0,
}


def test_a_dqn_save_streams_a_gib_buffer_in_bounded_memory_and_restores_it(checkpoints: Path) -> None:
    with Trainer("dqn", "CartPole-v1", DQN) as trainer:
        buffer = trainer.resources.need_replay_buffer()
        for batch in batches(ROWS_PER_GIB):
            buffer.add_batch(batch)
        buffer.update_priorities(priorities(ROWS_PER_GIB))
        assert buffer.stats()["policies"][DEFAULT_POLICY_ID]["est_size_bytes"] >= GIB - ROW_BYTES
        with PeakRss([psutil.Process().pid]) as save:
            path = Path(trainer.save(checkpoints))
        assert save.growth[0] <= SAVE_GROWTH_BOUND, f"the save grew the driver by {save.growth[0] / GIB:.2f} GiB"
        assert (path / STATE_FILE).stat().st_size < 10 << 20  # the rows are in their own files, not the pickle
        stats = buffer.stats()
        saved = buffer.replay()
        with PeakRss([psutil.Process().pid]) as restore, Trainer.from_checkpoint(path) as restored:
            # Memory for one buffer (the new one) and the new trainer's model: no second copy of the rows.
            assert restore.growth[0] <= GIB + SAVE_GROWTH_BOUND
            again = restored.resources.need_replay_buffer()
            assert again.stats() == stats
            assert_same_replay(saved, again.replay())


APEX = {
    "num_workers": 1,
    "num_cpus_per_worker": 0.25,
    "num_replay_shards": 2,
    "buffer_size": 2 * ROWS_PER_GIB,
    "learning_starts": 2,
    "train_batch_size": 64,
    "rollout_fragment_length": 20,
    "store_buffer_in_checkpoints": True,
    "seed": 0,
}


def test_apex_shards_stream_their_gib_each_from_their_own_processes_and_restore(checkpoints: Path) -> None:
    with Trainer("apex", "CartPole-v1", APEX) as trainer:
        shards = list(trainer.resources.need_replay_actors())
        for shard in shards:
            for batch in batches(ROWS_PER_GIB):
                ray.get(shard.add_batch.remote(batch), timeout=CALL_TIMEOUT_S)
            ray.get(shard.update_priorities.remote(priorities(ROWS_PER_GIB)), timeout=CALL_TIMEOUT_S)
        pids = [psutil.Process().pid] + [ray.get(shard.pid.remote(), timeout=CALL_TIMEOUT_S) for shard in shards]
        with PeakRss(pids) as save:
            path = Path(trainer.save(checkpoints))
        for pid, growth in zip(["driver", "shard 0", "shard 1"], save.growth):
            assert growth <= SAVE_GROWTH_BOUND, f"the save grew the {pid} by {growth / GIB:.2f} GiB"
        assert sorted({f.name.split(".")[0] for f in path.glob("*.npy")}) == ["replay_shard_0", "replay_shard_1"]
        saved = ray.get([shard.replay.remote() for shard in shards], timeout=CALL_TIMEOUT_S)
        stats = ray.get([shard.stats.remote() for shard in shards], timeout=CALL_TIMEOUT_S)
    with Trainer.from_checkpoint(path) as restored:
        shards = list(restored.resources.need_replay_actors())
        replayed = ray.get([shard.replay.remote() for shard in shards], timeout=CALL_TIMEOUT_S)
        again = ray.get([shard.stats.remote() for shard in shards], timeout=CALL_TIMEOUT_S)
    for before, after, one, other in zip(stats, again, saved, replayed):
        assert after["policies"] == before["policies"] and after["num_steps_added"] == before["num_steps_added"]
        assert_same_replay(one, other)


def test_a_checkpoint_with_the_rows_inside_its_pickle_still_restores(checkpoints: Path) -> None:
    """Checkpoints written before the rows were streamed keep them in ``state.pkl``."""
    with Trainer("dqn", "CartPole-v1", {**DQN, "buffer_size": 500}) as trainer:
        buffer = trainer.resources.need_replay_buffer()
        for batch in batches(300, size=100):
            buffer.add_batch(batch)
        buffer.update_priorities(priorities(300))
        state = trainer.get_state()  # the rows inline, as every save wrote them before
        contents = state["resources"]["replay_buffer"]["buffers"][DEFAULT_POLICY_ID]["contents"]
        assert isinstance(contents["columns"]["obs"], np.ndarray)
        path = write_checkpoint(checkpoints / "checkpoint_000000", state, {"algo": "dqn"})
        saved = buffer.replay()
    assert not list(path.glob("*.npy"))
    assert read_checkpoint(path)[0]["resources"]["replay_buffer"]["num_steps_added"] == 300
    with Trainer.from_checkpoint(path) as restored:
        again = restored.resources.need_replay_buffer()
        assert len(again.buffers[DEFAULT_POLICY_ID]) == 300
        assert_same_replay(saved, again.replay())


def test_restoring_streamed_rows_needs_the_checkpoint_directory(checkpoints: Path) -> None:
    with Trainer("dqn", "CartPole-v1", {**DQN, "buffer_size": 500}) as trainer:
        trainer.resources.need_replay_buffer().add_batch(atari_rows(0, 10))
        path = trainer.save(checkpoints)
        state, _ = read_checkpoint(path)
        with pytest.raises(ReplayBufferError, match="column 'obs' of the state is stored outside it"):
            trainer.set_state(state)  # a state read by hand: its rows are in the checkpoint's files
        trainer.set_state(state, checkpoint_dir=Path(path))
        assert len(trainer.resources.need_replay_buffer().buffers[DEFAULT_POLICY_ID]) == 10


def test_a_shard_dead_at_save_fails_the_save_and_leaves_nothing_behind(checkpoints: Path) -> None:
    small = {**APEX, "buffer_size": 400}
    with Trainer("apex", "CartPole-v1", small) as trainer:
        shards = trainer.resources.need_replay_actors()
        ray.get([shard.add_batch.remote(atari_rows(0, 50)) for shard in shards], timeout=CALL_TIMEOUT_S)
        first = Path(trainer.save(checkpoints))
        ray.kill(shards[1])
        trainer.iteration += 1  # the next save is a new checkpoint
        with pytest.raises(ReplayShardError, match="replay shard 1 died before it answered"):
            trainer.save(checkpoints)
    assert sorted(p.name for p in checkpoints.iterdir()) == [first.name]  # the staged files are gone
    assert len(list(first.glob("replay_shard_1.*.npy"))) == 3
