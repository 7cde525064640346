"""env_backend 'envpool': a worker's envs in one EnvPool (no Ray: the rollout worker runs in this process)."""

from __future__ import annotations

import pickle
import sys
from typing import Any, Iterator

import numpy as np
import pytest
import torch
from fakes import bc_loss

from flowrl.actors import RolloutWorker
from flowrl.config import TrainerConfig
from flowrl.data import DEFAULT_POLICY_ID, SampleBatch
from flowrl.envs import env_spaces, get_env_creator, make_atari_env
from flowrl.envs.envpool_backend import MISSING_ENVPOOL_MESSAGE, envpool_task, make_pool_envs
from flowrl.errors import ConfigError, EnvError
from flowrl.policy import PolicySpec, TorchPolicy

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Act with one PyTorch thread, as remote workers do: several spin against each other on a loaded machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def worker(env_id: str = "CartPole-v1", **config: Any) -> RolloutWorker:
    """A local rollout worker on ``env_id`` with the default model, sampling 8 envs through EnvPool."""
    config = {"seed": 0, "env_backend": "envpool", "num_envs_per_worker": 8, "rollout_fragment_length": 50, **config}
    obs_space, action_space = env_spaces(env_id, config.get("env_config"))
    spec = PolicySpec(TorchPolicy, obs_space, action_space, TrainerConfig(), {"loss_fn": bc_loss})
    return RolloutWorker(env_creator=get_env_creator(env_id), policy_specs={DEFAULT_POLICY_ID: spec}, config=config)


def test_a_missing_envpool_is_reported_with_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "envpool", None)
    assert MISSING_ENVPOOL_MESSAGE == (
        "env_backend 'envpool' needs the optional dependency envpool: pip install -e '.[envpool]' in a clone of "
        "flowrl (pip install 'flowrl-ray[envpool]' once published)"
    )
    with pytest.raises(EnvError) as info:
        worker()
    assert str(info.value) == MISSING_ENVPOOL_MESSAGE and isinstance(info.value.__cause__, ImportError)


def test_env_backend_is_checked_with_the_config() -> None:
    assert TrainerConfig().env_backend == "gymnasium"
    with pytest.raises(ConfigError, match="env_backend.*'envpol'.*'gymnasium'.*'envpool'"):
        TrainerConfig.from_dict({"env_backend": "envpol"})
    with pytest.raises(
        ConfigError, match="restart_failed_sub_environments=True recreates one failing env, but env_backend"
    ):
        TrainerConfig.from_dict({"env_backend": "envpool", "restart_failed_sub_environments": True})


# ---- with EnvPool installed


@pytest.fixture
def envpool() -> Any:
    return pytest.importorskip("envpool")


def test_gymnasium_ids_map_to_envpool_tasks_with_flowrls_atari_options(envpool: Any) -> None:
    assert envpool_task("CartPole-v1", {"max_episode_steps": 100}) == ("CartPole-v1", {"max_episode_steps": 100})
    task, options = envpool_task(
        "ALE/Pong-v5", {"frame_stack": 2, "clip_rewards": False, "max_num_frames_per_episode": 4000}
    )
    assert task == "Pong-v5"
    assert options == {
        "stack_num": 2,
        "frame_skip": 4,
        "noop_max": 30,
        "episodic_life": True,
        "use_fire_reset": True,
        "reward_clip": False,
        "full_action_space": False,
        "repeat_action_probability": 0.25,
        "img_height": 84,
        "img_width": 84,
        "max_episode_steps": 1000,
    }
    defaults = {**options, "stack_num": 4, "reward_clip": True, "repeat_action_probability": 0.0}
    del defaults["max_episode_steps"]  # EnvPool's own: 27,000 steps, the 108,000 frames Gymnasium's ids stop at
    assert envpool_task("PongNoFrameskip-v4", {}) == ("Pong-v5", defaults)  # no sticky actions, as the papers played
    with pytest.raises(EnvError, match=r"cannot apply env_config keys \['scale_obs'\] to 'ALE/Pong-v5'"):
        envpool_task("ALE/Pong-v5", {"scale_obs": True})
    with pytest.raises(EnvError, match="EnvPool has no 'Taxi-v4'"):
        envpool_task("Taxi-v4", {})


def test_a_worker_samples_all_its_envs_through_one_pool(envpool: Any) -> None:
    w = worker()
    assert len({id(env.vector) for env in w.envs}) == 1 and w.envs[0].observation_space == env_spaces("CartPole-v1")[0]
    batch = w.sample()
    assert batch.count == 8 * 50
    ends = 0
    for env_id in range(8):
        rows = batch[SampleBatch.ENV_ID] == env_id
        obs, new_obs = batch[SampleBatch.OBS][rows], batch[SampleBatch.NEW_OBS][rows]
        done = batch[SampleBatch.TERMINATEDS][rows] | batch[SampleBatch.TRUNCATEDS][rows]
        ends += int(done.sum())
        # Each env's rows follow on from each other within an episode; an ended one restarts near 0.
        np.testing.assert_array_equal(new_obs[:-1][~done[:-1]], obs[1:][~done[:-1]])
        assert np.all(np.abs(obs[1:][done[:-1]]) < 0.05)
    episodes = w.get_metrics().episodes
    assert ends > 0 and len(episodes) == ends
    assert sum(e["episode_length"] for e in episodes) == sum(
        e["episode_reward"] for e in episodes
    )  # CartPole: 1 a step
    w.stop()


def test_envpool_workers_with_one_seed_sample_the_same(envpool: Any) -> None:
    workers = [worker(), worker(), worker(seed=1)]
    a, b, other = (w.sample() for w in workers)
    np.testing.assert_array_equal(a[SampleBatch.OBS], b[SampleBatch.OBS])
    assert not np.array_equal(other[SampleBatch.OBS], a[SampleBatch.OBS])
    for w in workers:
        w.stop()


def test_a_checkpoint_restarts_the_episodes_of_envpool_envs(envpool: Any) -> None:
    w = worker()
    w.sample()
    state = w.get_state()
    assert state["sampler"]["envs"] == [None] * 8  # their state lives in EnvPool's C++ envs
    restored = worker()
    assert restored.set_state(state) == list(range(8))  # every env starts a new episode
    assert restored.sample().count == 8 * 50
    w.stop()
    restored.stop()


def test_only_gymnasium_ids_can_be_stepped_by_envpool(envpool: Any) -> None:
    import gymnasium as gym

    spec = PolicySpec(TorchPolicy, *env_spaces("CartPole-v1"), TrainerConfig(), {"loss_fn": bc_loss})
    with pytest.raises(EnvError, match="steps EnvPool's own builds of Gymnasium ids"):
        RolloutWorker(
            env_creator=lambda env_config: gym.make("CartPole-v1"),
            policy_specs={DEFAULT_POLICY_ID: spec},
            config={"env_backend": "envpool"},
        )


def test_the_pool_closes_once_for_all_its_envs(envpool: Any) -> None:
    envs = make_pool_envs("CartPole-v1", 3, {}, seed=0, num_threads=1)
    for env in envs:
        env.close()
    assert envs[0].vector._closed
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(envs[0])


@pytest.mark.parametrize("env_id", ["ALE/Pong-v5", "PongNoFrameskip-v4"])
def test_envpool_atari_envs_have_the_spaces_of_make_atari_env(envpool: Any, env_id: str) -> None:
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    for env_config in ({}, {"frame_stack": 2, "screen_size": 64}):
        [pooled] = make_pool_envs(env_id, 1, env_config, seed=0, num_threads=1)
        gymnasium_env = make_atari_env(env_id, **env_config)
        assert pooled.observation_space == gymnasium_env.observation_space
        assert pooled.action_space == gymnasium_env.action_space
        obs, _ = pooled.reset()
        assert obs.shape == gymnasium_env.observation_space.shape and obs.dtype == np.uint8
        pooled.close()
        gymnasium_env.close()


def test_an_envpool_atari_worker_trains_on_clipped_lives(envpool: Any) -> None:
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    w = worker(
        "ALE/Breakout-v5",
        num_envs_per_worker=2,
        rollout_fragment_length=200,
        env_config={"repeat_action_probability": 0.0},
    )
    batch = w.sample()
    assert batch[SampleBatch.OBS].shape == (400, 4, 84, 84) and batch[SampleBatch.OBS].dtype == np.uint8
    assert set(batch[SampleBatch.REWARDS].tolist()) <= {0.0, 1.0}
    games = w.get_metrics().episodes
    assert int(batch[SampleBatch.TERMINATEDS].sum()) > len(games)  # lives end training episodes; games are reported
    w.stop()


def test_a_trainer_samples_through_envpool_in_remote_workers(envpool: Any, ray_session: None) -> None:
    from flowrl import Trainer

    config = {
        "env_backend": "envpool",
        "num_workers": 1,
        "num_cpus_per_worker": 0.5,
        "num_envs_per_worker": 8,
        "rollout_fragment_length": 25,
        "train_batch_size": 200,
        "sgd_minibatch_size": 100,
        "num_sgd_iter": 1,
        "seed": 0,
    }
    trainer = Trainer("ppo", "CartPole-v1", config)
    try:
        remote_envs = trainer.workers.foreach_worker(lambda w: type(w.envs[0]).__name__, local=False)
        assert remote_envs == ["PoolEnv"]
        result = trainer.train()
        result = trainer.train()
        assert result["timesteps_total"] == 400 and result["episodes_total"] > 0
        assert 8 < result["episode_len_mean"] < 500
    finally:
        trainer.stop()
