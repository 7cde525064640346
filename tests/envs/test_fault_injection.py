"""The fault-injection env: each fault kind fires in its window and on its workers only, ``times``
holds across instances, processes and restarts, and bad fault configs are named."""

from __future__ import annotations

import math
import sys
import time
import uuid
from typing import Any, Iterator

import gymnasium as gym
import numpy as np
import pytest
import ray
import ray.cloudpickle
from gymnasium import spaces

from flowrl.envs import (
    FaultInjectEnv,
    InjectedFault,
    fault_counter,
    faults_fired,
    release_fault_counters,
    remove_fault_counter,
    testing,
)
from flowrl.envs.context import EnvContext
from flowrl.errors import EnvError, FlowRLError

pytestmark = pytest.mark.unit

# Ray's workers cannot import this module (pytest's pythonpath reaches only the test process):
# the env and actor classes below travel to them by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class TickEnv(gym.Env[np.ndarray, int]):
    """Never ends; observes ``[steps taken, 0]``. The first element is bounded, the second is not."""

    observation_space = spaces.Box(np.array([0, -np.inf], np.float32), np.array([1e6, np.inf], np.float32))
    action_space = spaces.Discrete(2)

    def __init__(self, env_config: dict[str, Any] | None = None) -> None:
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        return self._obs(), 1.0, False, False, {}

    def _obs(self) -> np.ndarray:
        return np.array([self.t, 0.0], dtype=np.float32)


class SpaceEnv(gym.Env[Any, int]):
    """Observes samples of ``env_config["space"]``."""

    action_space = spaces.Discrete(2)

    def __init__(self, env_config: dict[str, Any]) -> None:
        self.observation_space = env_config["space"]
        self.observation_space.seed(0)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        return self.observation_space.sample(), {}

    def step(self, action: int) -> tuple[Any, float, bool, bool, dict]:
        return self.observation_space.sample(), 0.0, False, False, {}


@pytest.fixture
def counter() -> Iterator[str]:
    """A counter name of this test's own, removed after it."""
    name = f"test-{uuid.uuid4().hex[:8]}"
    yield name
    remove_fault_counter(name)


@pytest.fixture
def local_counters(monkeypatch: pytest.MonkeyPatch) -> None:
    """Count in this process, as without Ray, even when another test has started the shared Ray session."""
    monkeypatch.setattr(testing, "_ray_initialized", lambda: False)


def make(faults: list[dict[str, Any]], counter: str = "-", *, env: Any = TickEnv, **context: Any) -> FaultInjectEnv:
    """A reset FaultInjectEnv around ``env`` in remote worker 1, slot 0 unless ``context`` says otherwise."""
    context.setdefault("worker_index", 1)
    instance = FaultInjectEnv(EnvContext({"env": env, "faults": faults, "fault_counter": counter}, **context))
    instance.reset(seed=0)
    return instance


def raised_at(env: gym.Env, num_steps: int) -> list[int]:
    """The steps (0-based) among the next ``num_steps`` at which ``env.step`` raised InjectedFault."""
    raised = []
    for step in range(num_steps):
        try:
            env.step(0)
        except InjectedFault:
            raised.append(step)
    return raised


# --- where and when ---


def test_raise_fires_in_its_step_window_and_names_fault_worker_and_step(local_counters: None) -> None:
    env = make([{"kind": "raise", "steps": [3, 5]}], worker_index=2, vector_index=1)
    for _ in range(3):
        env.step(0)
    with pytest.raises(InjectedFault) as info:
        env.step(0)
    assert str(info.value) == "injected fault 'raise#0' (kind 'raise') in worker 2, vector index 1 at step 3"
    assert raised_at(env, 4) == [0]  # step 4 still raises; steps 5.. don't
    assert env.fired == {"raise#0": 2}


def test_default_workers_are_the_remote_ones(local_counters: None) -> None:
    faults = [{"kind": "raise"}]
    assert raised_at(make(faults, worker_index=0), 3) == []
    assert raised_at(FaultInjectEnv({"env": TickEnv, "faults": faults}), 3) == []  # a plain dict: worker 0
    assert raised_at(make(faults, worker_index=1), 3) == [0, 1, 2]
    assert raised_at(make(faults, worker_index=5, vector_index=3), 1) == [0]


def test_worker_and_vector_indices_select_the_envs(local_counters: None) -> None:
    faults = [{"kind": "raise", "worker_indices": [0, 2], "vector_indices": [1]}]
    fires = {
        (worker, vector): bool(raised_at(make(faults, worker_index=worker, vector_index=vector), 1))
        for worker in range(3)
        for vector in range(2)
    }
    assert [place for place, fired in fires.items() if fired] == [(0, 1), (2, 1)]


def test_at_step_is_a_one_step_window(local_counters: None) -> None:
    assert raised_at(make([{"kind": "raise", "at_step": 2}]), 5) == [2]


def test_on_reset_fires_in_reset_and_counts_resets(local_counters: None) -> None:
    env = make([{"kind": "raise", "on_reset": True, "at_step": 2}])  # make() did reset 0
    assert raised_at(env, 5) == []
    env.reset()
    with pytest.raises(InjectedFault, match="at reset 2"):
        env.reset()
    env.reset()


def test_hang_blocks_for_hang_s_then_steps(local_counters: None) -> None:
    env = make([{"kind": "hang", "at_step": 1, "hang_s": 0.3}])
    env.step(0)
    started = time.monotonic()
    obs, *_ = env.step(0)
    assert time.monotonic() - started >= 0.3
    assert obs[0] == 2  # the wrapped env stepped after the hang


def test_slow_sleeps_delay_s_in_each_step_of_its_window(local_counters: None) -> None:
    env = make([{"kind": "slow", "steps": [0, 4], "delay_s": 0.05}])
    started = time.monotonic()
    for _ in range(4):
        env.step(0)
    assert time.monotonic() - started >= 0.2
    assert env.fired == {"slow#0": 4}


# --- observation and reward faults ---


def test_observation_and_reward_faults_on_cartpole(local_counters: None) -> None:
    faults = [
        {"kind": "nan_obs", "at_step": 0},
        {"kind": "out_of_space_obs", "at_step": 1},
        {"kind": "wrong_shape_obs", "at_step": 2},
        {"kind": "nan_reward", "at_step": 3},
    ]
    env = make(faults, env="CartPole-v1")
    space = env.observation_space
    nan_obs, *_ = env.step(0)
    assert nan_obs.shape == (4,) and nan_obs.dtype == np.float32 and np.isnan(nan_obs).all()
    outside, *_ = env.step(0)
    # The cart position is the first element with a finite bound (4.8); the others are kept.
    assert outside.dtype == np.float32 and outside[0] > space.high[0] and np.isfinite(outside).all()
    assert not space.contains(outside)
    wrong_shape, *_ = env.step(0)
    assert wrong_shape.shape == (5,)
    obs, reward, *_ = env.step(0)
    assert math.isnan(reward) and space.contains(obs)
    obs, reward, *_ = env.step(0)
    assert space.contains(obs) and reward == 1.0


@pytest.mark.parametrize("kind", ["nan_obs", "out_of_space_obs", "wrong_shape_obs"])
@pytest.mark.parametrize(
    "space",
    [
        spaces.Box(-1.0, 1.0, (2, 3), np.float32),
        spaces.Box(0, 10, (3,), np.int64),
        spaces.Box(-1.0, 1.0, (), np.float64),
        spaces.Discrete(3, start=1),
        spaces.MultiDiscrete([2, 3]),
        spaces.MultiBinary(4),
        spaces.Dict({"a": spaces.Discrete(2), "b": spaces.Box(-1.0, 1.0, (2,))}),
        spaces.Tuple((spaces.Box(-1.0, 1.0, (2,)), spaces.Discrete(2))),
    ],
    ids=repr,
)
def test_every_observation_fault_leaves_the_space(kind: str, space: spaces.Space[Any], local_counters: None) -> None:
    config = {"env": SpaceEnv, "env_config": {"space": space}, "faults": [{"kind": kind}]}
    env = FaultInjectEnv(EnvContext(config, worker_index=1))
    env.reset()
    obs, *_ = env.step(0)
    assert not space.contains(obs)


@pytest.mark.parametrize(
    "space",
    [spaces.Box(-np.inf, np.inf, (3,), np.float32), spaces.Box(0, 255, (3,), np.uint8)],
    ids=["unbounded", "uint8-full-range"],
)
def test_out_of_space_needs_a_bound_it_can_exceed(space: spaces.Space[Any]) -> None:
    faults = [{"kind": "out_of_space_obs", "name": "oos", "worker_indices": [3]}]
    # Reported by any instance (here worker 0's), even where the fault would never fire.
    with pytest.raises(EnvError, match="fault 'oos' .*needs an observation element with a bound"):
        FaultInjectEnv({"env": SpaceEnv, "env_config": {"space": space}, "faults": faults})


# --- times and restarts (counted in this process) ---


def test_times_holds_across_instances_and_a_restart(local_counters: None, counter: str) -> None:
    faults = [{"kind": "raise", "name": "boom", "steps": [0, 2], "times": 3}]
    assert raised_at(make(faults, counter), 5) == [0, 1]
    assert raised_at(make(faults, counter, worker_index=1, recreated_worker=True), 5) == [0]
    assert raised_at(make(faults, counter, worker_index=2), 5) == []
    assert faults_fired(counter) == {"boom": 3}


def test_unlimited_faults_are_not_counted_across_processes(local_counters: None, counter: str) -> None:
    env = make([{"kind": "nan_reward", "steps": [0, 3]}], counter)
    raised_at(env, 5)
    assert env.fired == {"nan_reward#0": 3} and faults_fired(counter) == {}


def test_skip_recreated(local_counters: None) -> None:
    faults = [{"kind": "raise", "skip_recreated": True}]
    assert raised_at(make(faults, recreated_worker=True), 3) == []
    assert raised_at(make(faults), 1) == [0]


def test_release_drops_local_counters(local_counters: None, counter: str) -> None:
    raised_at(make([{"kind": "raise", "name": "once", "times": 1}], counter), 2)
    assert faults_fired(counter) == {"once": 1}
    release_fault_counters()
    assert faults_fired(counter) == {}


def test_fault_counter_needs_ray(local_counters: None) -> None:
    with pytest.raises(FlowRLError, match="needs Ray"):
        fault_counter("no-ray")


# --- validation ---


@pytest.mark.parametrize(
    "fault, message",
    [
        ({"kind": "raise", "tims": 1}, "faults[0]: unknown key 'tims' (did you mean 'times'?); valid keys: kind, name"),
        ({"kind": "rase"}, "faults[0]['kind']='rase' is not a fault kind; valid kinds: raise, hang, exit, slow"),
        ({}, "faults[0]['kind']=None is not a fault kind"),
        ({"kind": "raise", "steps": [5, 2]}, "faults[0]['steps']=[5, 2] must be [start, stop]"),
        ({"kind": "raise", "steps": [1, 2], "at_step": 1}, "faults[0] gives both 'steps' and 'at_step'"),
        ({"kind": "raise", "at_step": -1}, "faults[0]['at_step']=-1 must be an integer >= 0"),
        ({"kind": "nan_obs", "on_reset": True}, "faults[0]['on_reset']=True is for kinds raise, hang, exit"),
        ({"kind": "raise", "hang_s": 1}, "faults[0]['hang_s'] is an option of kind 'hang' only"),
        ({"kind": "hang", "hang_s": 0}, "faults[0]['hang_s']=0 must be a number of seconds > 0"),
        ({"kind": "slow", "delay_s": "1"}, "faults[0]['delay_s']='1' must be a number of seconds >= 0"),
        ({"kind": "raise", "times": 0}, "faults[0]['times']=0 must be an integer >= 1, or None"),
        ({"kind": "raise", "worker_indices": 1}, "faults[0]['worker_indices']=1 must be a list of integers >= 0"),
        ({"kind": "raise", "skip_recreated": "yes"}, "faults[0]['skip_recreated']='yes' must be True or False"),
        ("raise", "faults[0] must be a dict with at least a 'kind'"),
    ],
)
def test_a_bad_fault_is_named(fault: Any, message: str) -> None:
    with pytest.raises(EnvError) as info:
        FaultInjectEnv({"env": TickEnv, "faults": [fault]})
    assert message in str(info.value)


def test_every_problem_is_reported_at_once() -> None:
    faults = [{"kind": "raise", "name": "x"}, {"kind": "hang", "name": "x", "times": -1}, {"kind": "explode"}]
    with pytest.raises(EnvError) as info:
        FaultInjectEnv({"env": TickEnv, "faults": faults})
    text = str(info.value)
    assert text.startswith("invalid FaultInjectEnv faults (2 problems):")
    assert "faults[1]['times']=-1" in text and "faults[2]['kind']='explode'" in text


def test_duplicate_names_are_rejected() -> None:
    faults = [{"kind": "raise", "name": "x"}, {"kind": "hang", "name": "x"}]
    with pytest.raises(EnvError, match="fault name 'x' is used more than once"):
        FaultInjectEnv({"env": TickEnv, "faults": faults})


@pytest.mark.parametrize(
    "env_config, message",
    [
        ({"env": TickEnv, "fault": []}, "unknown key(s) 'fault' (did you mean 'faults'?); valid keys: env, env_config"),
        ({"faults": []}, "FaultInjectEnv env_config needs 'env'"),
        ({"env": TickEnv, "faults": {"kind": "raise"}}, "env_config['faults'] must be a list of fault dicts"),
        ({"env": TickEnv, "fault_counter": ""}, "env_config['fault_counter']='' must be a non-empty string"),
        ({"env": "MultiAgentCartPole"}, "FaultInjectEnv wraps single-agent gymnasium envs"),
    ],
)
def test_a_bad_env_config_is_named(env_config: dict[str, Any], message: str) -> None:
    with pytest.raises(EnvError) as info:
        FaultInjectEnv(env_config)
    assert message in str(info.value)


def test_no_faults_is_the_wrapped_env() -> None:
    env = FaultInjectEnv({"env": "CartPole-v1"})
    assert env.observation_space == gym.make("CartPole-v1").observation_space
    obs, _ = env.reset(seed=0)
    assert env.step(0)[0].shape == obs.shape


# --- across Ray processes ---


@ray.remote(num_cpus=0)
class EnvActor:
    """One FaultInjectEnv in its own process, as in a rollout worker."""

    def __init__(self, env_config: dict[str, Any], worker_index: int, recreated_worker: bool = False) -> None:
        self.env = FaultInjectEnv(EnvContext(env_config, worker_index=worker_index, recreated_worker=recreated_worker))
        self.env.reset(seed=0)

    def raised_at(self, num_steps: int) -> list[int]:
        return raised_at(self.env, num_steps)


@pytest.mark.timeout(60)
def test_times_is_atomic_across_processes(ray_session: None, counter: str) -> None:
    config = {"env": TickEnv, "fault_counter": counter, "faults": [{"kind": "raise", "name": "boom", "times": 5}]}
    actors = [EnvActor.remote(config, worker_index) for worker_index in (1, 2)]
    raised = ray.get([actor.raised_at.remote(20) for actor in actors], timeout=30)
    assert sum(len(steps) for steps in raised) == 5
    assert faults_fired(counter) == {"boom": 5}


@pytest.mark.timeout(60)
def test_exit_kills_the_process_and_its_count_survives(ray_session: None, counter: str) -> None:
    faults = [{"kind": "exit", "name": "crash", "at_step": 2, "times": 1}]
    config = {"env": TickEnv, "fault_counter": counter, "faults": faults}
    worker = EnvActor.remote(config, 1)
    assert ray.get(worker.raised_at.remote(2), timeout=30) == []
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(worker.raised_at.remote(1), timeout=30)
    # The dead worker created the counter; being detached, it outlived its creator.
    assert faults_fired(counter) == {"crash": 1}
    replacement = EnvActor.remote(config, 1, True)
    assert ray.get(replacement.raised_at.remote(5), timeout=30) == []


@pytest.mark.timeout(60)
def test_default_hang_blocks_its_worker(ray_session: None) -> None:
    worker = EnvActor.remote({"env": TickEnv, "faults": [{"kind": "hang", "at_step": 0}]}, 1)
    ray.get(worker.__ray_ready__.remote(), timeout=30)
    with pytest.raises(ray.exceptions.GetTimeoutError):
        ray.get(worker.raised_at.remote(1), timeout=1)
    ray.kill(worker)


@pytest.mark.timeout(60)
def test_the_drivers_env_creates_the_counter_and_release_removes_it(ray_session: None, counter: str) -> None:
    # Worker 0's env (the one a Trainer checks in the driver) never fires, but creates the counter.
    FaultInjectEnv({"env": TickEnv, "fault_counter": counter, "faults": [{"kind": "exit", "times": 1}]})
    handle = ray.get_actor(testing.counter_actor_name(counter), namespace=testing.COUNTER_NAMESPACE)
    assert ray.get(handle.take.remote("f", 1), timeout=30) is True
    assert ray.get(fault_counter(counter).take.remote("f", 1), timeout=30) is False  # the same actor
    assert faults_fired(counter) == {"f": 1}
    release_fault_counters()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # ray.kill returns before the name is free
        try:
            ray.get_actor(testing.counter_actor_name(counter), namespace=testing.COUNTER_NAMESPACE)
        except ValueError:
            break
        time.sleep(0.1)
    assert faults_fired(counter) == {}
