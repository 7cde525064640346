"""Samplers absorbing faults: bad observations and rewards (raise or drop the episode), envs that raise (no Ray)."""

from __future__ import annotations

import collections
import threading
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from fakes import bc_loss
from gymnasium import spaces

from flowrl.actors import RolloutWorker
from flowrl.actors.sampling.multi_agent import MultiAgentSampler
from flowrl.actors.sampling.recovery import MAX_DROPPED_IN_A_ROW, EpisodeStats
from flowrl.actors.sampling.vector import VectorSampler
from flowrl.config import TrainerConfig
from flowrl.data import DEFAULT_POLICY_ID, SampleBatch
from flowrl.envs import MultiAgentEnv
from flowrl.envs.context import EnvContext
from flowrl.errors import BadObservationError, EnvError
from flowrl.policy import PolicySpec, TorchPolicy

pytestmark = pytest.mark.unit

EPISODE_LENGTH = 5


class ScriptedEnv(gym.Env):
    """``obs = [t, 0]`` in ``Box(-10, 10, (2,))``, reward 1, episodes of ``EPISODE_LENGTH`` steps (terminated).

    ``faults`` maps this instance's count of ``step`` calls (1 = its first step, across
    episodes) to what that step does wrong; ``reset_faults`` does the same for ``reset`` calls.
    """

    observation_space = spaces.Box(-10.0, 10.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, faults: dict[int, str] | None = None, reset_faults: dict[int, str] | None = None) -> None:
        self.faults, self.reset_faults = dict(faults or {}), dict(reset_faults or {})
        self.steps = self.resets = self.t = 0
        self.closed = False

    def _obs(self, fault: str | None) -> Any:
        obs = np.array([self.t, 0.0], np.float32)
        if fault == "nan_obs":
            obs[0] = np.nan
        elif fault == "inf_obs":
            obs[1] = np.inf
        elif fault == "out_of_box":
            obs[0] = 20.0
        elif fault == "wrong_shape":
            return np.zeros(3, np.float32)
        elif fault == "scalar_obs":  # would broadcast silently into a [2] row
            return np.float32(1.0)
        elif fault == "complex_obs":  # no same-kind cast to the space's float32
            return obs.astype(np.complex64)
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.resets += 1
        self.t = 0
        fault = self.reset_faults.get(self.resets)
        if fault == "raise":
            raise RuntimeError("reset boom")
        return self._obs(fault), {}

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict]:
        self.steps += 1
        self.t += 1
        fault = self.faults.get(self.steps)
        if fault == "raise":
            raise RuntimeError("step boom")
        reward: Any = {"nan_reward": np.nan, "str_reward": "one"}.get(fault or "", 1.0)
        return self._obs(fault), reward, self.t >= EPISODE_LENGTH, False, {}

    def close(self) -> None:
        self.closed = True


class StubPolicy:
    """Acts 0; records every observation batch it is asked about; no postprocessing."""

    action_space = spaces.Discrete(2)
    postprocesses = True  # the sampler cuts its fragments into pieces, as for a postprocessing policy

    def __init__(self) -> None:
        self.seen: list[np.ndarray] = []

    def compute_actions(self, obs_batch: np.ndarray, **_: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        self.seen.append(np.array(obs_batch))
        return np.zeros(len(obs_batch), np.int64), {}

    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        return batch


def make_sampler(
    faults: dict[int, str] | None = None,
    *,
    mode: str = "raise",
    fragment_length: int = 12,
    num_envs: int = 2,
    reset_faults: dict[int, str] | None = None,
    faulty: int = 1,
    **kwargs: Any,
) -> tuple[VectorSampler, StubPolicy]:
    """Env ``faulty`` has the faults; the others are clean."""
    envs = [ScriptedEnv(faults, reset_faults) if i == faulty else ScriptedEnv() for i in range(num_envs)]
    policy = StubPolicy()
    sampler = VectorSampler(
        envs,  # type: ignore[arg-type]
        policy,
        fragment_length=fragment_length,
        seed=0,
        on_bad_observation=mode,
        worker_index=7,
        **kwargs,
    )
    return sampler, policy


def rows_of(batch: SampleBatch, env: int) -> SampleBatch:
    return SampleBatch({k: v[batch[SampleBatch.ENV_ID] == env] for k, v in batch.items()})


def assert_policy_saw_only_finite(policy: StubPolicy) -> None:
    assert all(np.isfinite(obs).all() for obs in policy.seen)


# -- on_bad_observation="raise": the message names worker, env, step, field, value and bound ----------------------


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("nan_obs", r"new_obs\[0\]=nan, which is not finite"),
        ("inf_obs", r"new_obs\[1\]=inf, which is not finite"),
        ("out_of_box", r"new_obs\[0\]=20.0 above observation_space.high\[0\]=10.0"),
        ("wrong_shape", r"new_obs=\[0., 0., 0.\] with shape \(3,\), but observation_space.shape is \(2,\)"),
        ("scalar_obs", r"new_obs=1.0 with shape \(\), but observation_space.shape is \(2,\)"),
        (
            "complex_obs",
            r"new_obs=\[3.\+0.j, 0.\+0.j\] of dtype complex64, which does not cast to observation_space.dtype float32",
        ),
        ("nan_reward", r"reward=nan, which is not finite"),
        ("str_reward", r"reward='one' of type str, which is not a real number"),
    ],
)
def test_bad_data_raises_naming_worker_env_step_field_and_bound(fault: str, message: str) -> None:
    sampler, policy = make_sampler({8: fault})  # env 1's 8th step: step 3 of its second episode (t counts from 0)
    with pytest.raises(
        BadObservationError,
        match=r"worker 7, env 1: env.step\(\) at step 2 of its episode \(vector step 7\) returned " + message,
    ):
        sampler.sample()
    assert_policy_saw_only_finite(policy)


def test_a_bad_first_observation_raises_naming_reset() -> None:
    with pytest.raises(
        BadObservationError, match=r"worker 7, env 1: env.reset\(\) \(vector step 0\) returned obs\[0\]=nan"
    ):
        make_sampler(reset_faults={1: "nan_obs"})
    sampler, _ = make_sampler(reset_faults={2: "nan_obs"})  # the first reset after an episode, used at vector step 5
    with pytest.raises(BadObservationError, match=r"env 1: env.reset\(\) \(vector step 5\) returned obs\[0\]=nan"):
        sampler.sample()
    sampler, _ = make_sampler(reset_faults={2: "out_of_box"})  # found with the fragment
    with pytest.raises(
        BadObservationError, match=r"env 1: env.reset\(\) \(vector step 5\) returned obs\[0\]=20.0 above"
    ):
        sampler.sample()


# -- on_bad_observation="drop_episode": the episode's rows are not returned, it is counted once ----------------------


@pytest.mark.parametrize(
    ("fault", "found_at_once"),
    [
        ("nan_obs", True),
        ("inf_obs", True),
        ("wrong_shape", True),
        ("scalar_obs", True),
        ("str_reward", True),
        # Found with the whole fragment (the policy never reads them): the episode ran to its end.
        ("out_of_box", False),
        ("nan_reward", False),
    ],
)
def test_drop_episode_leaves_out_the_bad_episode_and_counts_it(fault: str, found_at_once: bool) -> None:
    sampler, policy = make_sampler({8: fault}, mode="drop_episode")
    batch = sampler.sample()
    # Env 0: two whole episodes and 2 steps of a third. Env 1: its first episode (rows 0-4); the
    # second, bad at row 7, is dropped; the next one starts on the next row (or when it ended).
    env0, env1 = rows_of(batch, 0), rows_of(batch, 1)
    assert env0.count == 12
    assert env1[SampleBatch.T].tolist() == [0, 1, 2, 3, 4] + ([0, 1, 2, 3] if found_at_once else [0, 1])
    assert len(set(env1[SampleBatch.EPS_ID].tolist())) == 2
    assert batch.count == 12 + env1.count  # fewer than fragment_length * num_envs rows
    for column in (SampleBatch.OBS, SampleBatch.NEW_OBS, SampleBatch.REWARDS):
        assert np.isfinite(batch[column]).all() and (np.abs(batch[column]) <= 10).all()
    assert sampler.num_bad_observations == 1 and sampler.num_faulty_episodes == 0
    assert [s.episode_length for s in sampler.pop_episode_stats()] == [5, 5, 5]  # not the dropped one
    assert_policy_saw_only_finite(policy)
    assert sampler.sample().count == 24  # and sampling goes on as usual


def test_a_nonfinite_final_observation_drops_its_finished_episode() -> None:
    sampler, policy = make_sampler({5: "nan_obs"})  # the last observation of env 1's first episode
    with pytest.raises(
        BadObservationError,
        match=r"env 1: env.step\(\) at step 4 of its episode \(vector step 4\) returned new_obs\[0\]=nan",
    ):
        sampler.sample()
    sampler, policy = make_sampler({5: "nan_obs"}, mode="drop_episode")
    batch = sampler.sample()
    assert rows_of(batch, 1)[SampleBatch.T].tolist() == [0, 1, 2, 3, 4, 0, 1]
    assert [s.episode_length for s in sampler.pop_episode_stats()] == [5, 5, 5]  # env 0's two, env 1's second
    assert sampler.num_bad_observations == 1 and np.isfinite(batch[SampleBatch.NEW_OBS]).all()
    assert_policy_saw_only_finite(policy)


def test_a_dropped_episode_running_at_the_end_of_the_fragment_is_reset() -> None:
    # An out-of-bounds value is found with the whole fragment: the env's episode is still running then.
    sampler, _ = make_sampler({11: "out_of_box"}, mode="drop_episode")
    first = rows_of(sampler.sample(), 1)
    assert first[SampleBatch.T].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]  # rows 10 and 11 (t = 0, 1) dropped
    second = rows_of(sampler.sample(), 1)
    assert second[SampleBatch.T][0] == 0 and second[SampleBatch.EPS_ID][0] not in first[SampleBatch.EPS_ID]
    assert sampler.num_bad_observations == 1


def test_an_env_with_every_row_dropped_has_no_rows_and_postprocessing_still_runs() -> None:
    sampler, _ = make_sampler({4: "nan_reward"}, mode="drop_episode", fragment_length=4)  # env 1's episode: rows 0..3
    batch = sampler.sample()
    assert set(batch[SampleBatch.ENV_ID].tolist()) == {0} and batch.count == 4
    only_env, _ = make_sampler({4: "nan_reward"}, mode="drop_episode", fragment_length=4, num_envs=1, faulty=0)
    assert only_env.sample().count == 0


def test_complete_episodes_drops_the_carried_pieces_of_a_bad_episode() -> None:
    # Fragments of 2 steps: env 1's first episode (id 2) has carried 3 steps when its 4th is bad.
    sampler, _ = make_sampler({4: "nan_obs"}, mode="drop_episode", fragment_length=2, batch_mode="complete_episodes")
    batch = sampler.sample()
    assert 2 not in batch[SampleBatch.EPS_ID].tolist()
    for episode in batch.split_by_episode():
        assert episode[SampleBatch.T].tolist() == list(range(EPISODE_LENGTH))
    assert all(2 not in piece[SampleBatch.EPS_ID] for piece in sampler._carry[1])
    assert sampler.num_bad_observations == 1


def test_a_bad_first_observation_is_reset_again_when_dropping() -> None:
    sampler, policy = make_sampler(mode="drop_episode", reset_faults={1: "nan_obs", 3: "wrong_shape"})
    assert sampler.num_bad_observations == 1  # at construction: reset again
    batch = sampler.sample()
    assert rows_of(batch, 1)[SampleBatch.T].tolist() == [0, 1, 2, 3, 4] * 2 + [0, 1]
    assert sampler.num_bad_observations == 2 and sampler.envs[1].resets == 5
    assert_policy_saw_only_finite(policy)


def test_an_env_whose_every_episode_is_bad_fails_instead_of_spinning() -> None:
    faults = {k: "nan_obs" for k in range(1, MAX_DROPPED_IN_A_ROW + 2)}
    with pytest.raises(BadObservationError, match=f"{MAX_DROPPED_IN_A_ROW} episodes in a row of one env were dropped"):
        make_sampler(mode="drop_episode", reset_faults=faults)


# -- envs that raise ---------------------------------------------------------------------------------------------


def test_an_env_raising_in_step_is_recreated_with_env_maker_and_its_episode_dropped() -> None:
    made: list[int] = []

    def env_maker(vector_index: int) -> ScriptedEnv:
        made.append(vector_index)
        return ScriptedEnv()

    sampler, _ = make_sampler({8: "raise"}, env_maker=env_maker)
    old = sampler.envs[1]
    batch = sampler.sample()
    assert made == [1] and old.closed and sampler.envs[1] is not old
    assert sampler.num_faulty_episodes == 1 and sampler.num_bad_observations == 0
    assert rows_of(batch, 1)[SampleBatch.T].tolist() == [0, 1, 2, 3, 4] + [0, 1, 2, 3]
    assert [s.episode_length for s in sampler.pop_episode_stats()] == [5, 5, 5]


def test_an_env_raising_in_reset_is_recreated_with_env_maker() -> None:
    sampler, _ = make_sampler(reset_faults={2: "raise"}, env_maker=lambda i: ScriptedEnv())
    batch = sampler.sample()
    assert sampler.num_faulty_episodes == 1
    assert rows_of(batch, 1)[SampleBatch.T].tolist() == [0, 1, 2, 3, 4] * 2 + [0, 1]


def test_without_env_maker_the_env_error_propagates_unchanged() -> None:
    sampler, _ = make_sampler({3: "raise"})
    with pytest.raises(RuntimeError, match="^step boom$"):
        sampler.sample()
    with pytest.raises(RuntimeError, match="^reset boom$"):
        make_sampler(reset_faults={1: "raise"})


def test_recreated_envs_are_seeded_from_the_sampler_seed() -> None:
    seeds: list[list[int | None]] = [[], []]

    class SeedRecorder(ScriptedEnv):
        def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
            run.append(seed)
            return super().reset(seed=seed)

    for run in seeds:
        sampler, _ = make_sampler({2: "raise"}, env_maker=lambda i: SeedRecorder())
        sampler.sample()
    assert seeds[0] == seeds[1] and seeds[0][0] is not None


def test_an_env_failing_every_time_fails_the_sampler_instead_of_spinning() -> None:
    class Broken(ScriptedEnv):
        def step(self, action: Any) -> Any:
            raise RuntimeError("always")

    sampler, _ = make_sampler(env_maker=lambda i: Broken())
    sampler.envs[1] = Broken()
    with pytest.raises(
        EnvError, match=r"episodes in a row of one env were dropped; .*env.step\(\) raised RuntimeError: always"
    ):
        for _ in range(MAX_DROPPED_IN_A_ROW):
            sampler.sample()


def test_a_rollout_worker_reports_the_faults_its_sampler_absorbed() -> None:
    built: list[int] = []

    def creator(env_config: EnvContext) -> ScriptedEnv:
        built.append(env_config.vector_index)
        if env_config.vector_index == 0:
            return ScriptedEnv({16: "nan_obs"})
        return ScriptedEnv({3: "raise"} if built.count(1) == 1 else None)  # a recreated env works

    spec = PolicySpec(
        TorchPolicy, ScriptedEnv.observation_space, ScriptedEnv.action_space, TrainerConfig(), {"loss_fn": bc_loss}
    )
    config = {
        "seed": 0,
        "num_envs_per_worker": 2,
        "rollout_fragment_length": 12,
        "restart_failed_sub_environments": True,
        "on_bad_observation": "drop_episode",
    }
    worker = RolloutWorker(env_creator=creator, policy_specs={DEFAULT_POLICY_ID: spec}, config=config)
    batch = worker.sample()
    metrics = worker.get_metrics()
    assert (metrics.num_faulty_episodes, metrics.num_bad_observations) == (1, 0)
    assert built == [0, 1, 1] and batch.count == 12 + 12 - 3
    worker.sample()  # env 0's 16th step is bad
    metrics = worker.get_metrics()
    assert (metrics.num_faulty_episodes, metrics.num_bad_observations) == (0, 1)  # since the last report


# -- episode statistics ------------------------------------------------------------------------------------------


def test_pop_episode_stats_loses_nothing_while_another_thread_appends() -> None:
    sampler, _ = make_sampler()
    sampler.finished = collections.deque()  # unbounded here: the producer may run far ahead
    total = 50_000
    popped: list[EpisodeStats] = []

    def produce() -> None:
        for k in range(total):
            sampler.finished.append(EpisodeStats(float(k), 1))

    producer = threading.Thread(target=produce)
    producer.start()
    while producer.is_alive():
        popped += sampler.pop_episode_stats()
    producer.join()
    popped += sampler.pop_episode_stats()
    assert [s.episode_reward for s in popped] == [float(k) for k in range(total)]


# -- the multi-agent sampler ---------------------------------------------------------------------------------------


class TwoAgentEnv(MultiAgentEnv[str]):
    """Agents 'a' and 'b', obs ``[t]`` in ``Box(-10, 10, (1,))``, reward 1 each, episodes of 4 steps.

    ``faults`` maps this instance's count of ``step`` calls to ``(agent, fault)``.
    """

    def __init__(self, faults: dict[int, tuple[str, str]] | None = None, nan_resets: tuple[int, ...] = ()) -> None:
        self.possible_agents = ["a", "b"]
        self.agents: list[str] = []
        self.faults, self.nan_resets = dict(faults or {}), nan_resets
        self.steps = self.t = self.resets = 0

    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Box(-10.0, 10.0, (1,), np.float32)

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(2)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.t = 0
        self.resets += 1
        self.agents = list(self.possible_agents)
        first = 0.0 if self.resets not in self.nan_resets else np.nan
        return {"a": np.array([first], np.float32), "b": np.array([0.0], np.float32)}, {}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        self.steps += 1
        self.t += 1
        agent, fault = self.faults.get(self.steps, ("", ""))
        if fault == "raise":
            raise RuntimeError("multi-agent boom")
        obs = {a: np.array([self.t], np.float32) for a in self.agents}
        rewards = {a: 1.0 for a in self.agents}
        if fault == "nan_obs":
            obs[agent][0] = np.nan
        elif fault == "out_of_box":
            obs[agent][0] = 50.0
        elif fault == "wrong_shape":  # the policy's batch cannot even be stacked
            obs[agent] = np.array([self.t, self.t], np.float32)
        elif fault == "nan_reward":
            rewards[agent] = float("nan")
        done = self.t >= 4
        self.agents = [] if done else self.agents
        return obs, rewards, {a: done for a in obs}, {a: False for a in obs}, {}


def multi_agent_sampler(faults: dict[int, tuple[str, str]], **kwargs: Any) -> tuple[MultiAgentSampler, StubPolicy]:
    policy = StubPolicy()
    envs = [TwoAgentEnv(), TwoAgentEnv(faults)]
    sampler = MultiAgentSampler(envs, {"p": policy}, lambda agent: "p", fragment_length=6, worker_index=3, **kwargs)
    return sampler, policy


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        (
            "nan_obs",
            r"env.step\(\) at step 1 of its episode \(vector step 1\) "
            r"returned new_obs\['b'\]\[0\]=nan, which is not finite",
        ),
        ("out_of_box", r"new_obs\['b'\]\[0\]=50.0 above observation_space\('b'\).high\[0\]=10.0"),
        ("wrong_shape", r"new_obs\['b'\]=\[2., 2.\] with shape \(2,\), but observation_space\('b'\).shape is \(1,\)"),
        ("nan_reward", r"reward\['b'\]=nan, which is not finite"),
    ],
)
def test_multi_agent_bad_data_raises_naming_the_agent(fault: str, message: str) -> None:
    sampler, policy = multi_agent_sampler({2: ("b", fault)})
    with pytest.raises(BadObservationError, match=r"worker 3, env 1: .*" + message):
        sampler.sample()
    assert_policy_saw_only_finite(policy)


@pytest.mark.parametrize("fault", ["nan_obs", "out_of_box", "wrong_shape", "nan_reward", "last_obs"])
def test_multi_agent_drop_episode_leaves_out_every_agent_of_the_episode(fault: str) -> None:
    # A bad value at env 1's 2nd step (or, for last_obs, in the final observation at its 4th step).
    faults = {4: ("a", "nan_obs")} if fault == "last_obs" else {2: ("b", fault)}
    sampler, policy = multi_agent_sampler(faults, on_bad_observation="drop_episode")
    batch = sampler.sample()
    rows = batch.policy_batches["p"]
    env1 = rows[SampleBatch.ENV_ID] == 1
    last = fault == "last_obs"
    # Env 0: a whole episode, then 2 steps. Env 1: the dropped episode's steps (2, or all 4), then
    # a new episode: whole (agents 'a' and 'b' 4 rows each) or its first 2 steps.
    assert rows[SampleBatch.T][env1].tolist() == ([0, 1] * 2 if last else [0, 1, 2, 3] * 2)
    assert np.isfinite(rows[SampleBatch.NEW_OBS]).all() and np.isfinite(rows[SampleBatch.REWARDS]).all()
    assert batch.env_steps() == 12 - (4 if last else 2)
    assert sampler.num_bad_observations == 1
    assert len(sampler.pop_episode_stats()) == (1 if last else 2)
    assert_policy_saw_only_finite(policy)


def test_multi_agent_bad_first_observations_raise_or_are_reset_again() -> None:
    with pytest.raises(
        BadObservationError, match=r"env 0: env.reset\(\) \(vector step 0\) returned obs\['a'\]\[0\]=nan"
    ):
        MultiAgentSampler([TwoAgentEnv(nan_resets=(1,))], {"p": StubPolicy()}, lambda agent: "p", fragment_length=6)
    env = TwoAgentEnv(nan_resets=(1, 3))
    sampler = MultiAgentSampler(
        [env], {"p": StubPolicy()}, lambda a: "p", fragment_length=6, on_bad_observation="drop_episode"
    )
    batch = sampler.sample()  # reset 2's episode ends at vector step 4; reset 3 is bad, reset 4 starts the next
    assert batch.policy_batches["p"][SampleBatch.T].tolist() == [0, 1, 2, 3] * 2 + [0, 1] * 2 and batch.env_steps() == 6
    assert sampler.num_bad_observations == 2 and env.resets == 4


def test_multi_agent_env_raising_in_step_is_recreated() -> None:
    sampler, _ = multi_agent_sampler({2: ("", "raise")}, env_maker=lambda i: TwoAgentEnv())
    batch = sampler.sample()
    assert sampler.num_faulty_episodes == 1 and batch.env_steps() == 12 - 2
    with pytest.raises(RuntimeError, match="multi-agent boom"):
        multi_agent_sampler({2: ("", "raise")})[0].sample()
