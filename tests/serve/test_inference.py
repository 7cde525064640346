"""Inference policies from a checkpoint's policies.json and policies.safetensors: no Ray, no Trainer, no unpickling.

Policies are built without Ray (``policy_specs`` + ``PolicySpec.build``), given random
weights and written with ``policy_files``; ``load_policy`` must act exactly as they do.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from policy_files import build_policies, observations, write_files

import flowrl
from flowrl.data import DEFAULT_POLICY_ID
from flowrl.envs.spaces import space_from_json, space_to_json
from flowrl.errors import CheckpointError
from flowrl.policy import Policy, TorchPolicy
from flowrl.serve.inference import (
    POLICIES_JSON,
    POLICIES_WEIGHTS,
    InferencePolicy,
    load_policy,
)

pytestmark = [pytest.mark.unit, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
# (algorithm, env): discrete actions (PPO, DQN) and Box actions (DDPG, TD3, and PPO, whose
# Gaussian means leave the bounds and are clipped as the samplers clip them).
CASES = [
    ("ppo", "CartPole-v1"),
    ("dqn", "CartPole-v1"),
    ("ddpg", "Pendulum-v1"),
    ("td3", "Pendulum-v1"),
    ("sac", "Pendulum-v1"),
    ("sac", "CartPole-v1"),
    ("ppo", "Pendulum-v1"),
]


def by_parity(agent: int) -> str:
    return "small" if agent % 2 == 0 else "big"


def greedy(policy: Policy[Any], obs: np.ndarray) -> np.ndarray:
    """The original policy's greedy actions, clipped to a Box action space as the env would get them."""
    actions, _ = policy.compute_actions(obs, explore=False)
    space = policy.action_space
    return np.clip(actions, space.low, space.high) if isinstance(space, gym.spaces.Box) else actions


def assert_same_actions(loaded: np.ndarray, expected: np.ndarray, space: gym.Space[Any]) -> None:
    assert loaded.shape == expected.shape
    if isinstance(space, gym.spaces.Discrete):
        np.testing.assert_array_equal(loaded, expected)
        assert len(np.unique(expected)) > 1  # random weights: a check that means something
    else:
        np.testing.assert_allclose(loaded, expected, rtol=1e-6, atol=1e-6)


class WritesMarker:
    """A pickle that creates the file ``path`` when it is loaded (what a malicious state.pkl could do)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (str(self.path), "w"))


def write_malicious_state(directory: Path, marker: Path) -> None:
    (directory / "state.pkl").write_bytes(pickle.dumps({"worker": WritesMarker(marker)}))
    (directory / "metadata.json").write_text(json.dumps({"algo": "ppo", "iteration": 1}))


# -- round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize(("algo", "env"), CASES)
def test_a_loaded_policy_acts_as_the_original(algo: str, env: str, tmp_path: Path) -> None:
    policy_map, config = build_policies(algo, env)
    original = policy_map[DEFAULT_POLICY_ID]
    write_files(tmp_path, policy_map, algo, config)

    loaded = load_policy(tmp_path)

    assert isinstance(loaded, InferencePolicy)
    assert (loaded.algo, loaded.policy_id) == (algo, DEFAULT_POLICY_ID)
    assert loaded.observation_space == original.observation_space and loaded.action_space == original.action_space
    obs = observations(original.observation_space)
    actions = loaded.compute_actions(obs)
    assert_same_actions(actions, greedy(original, obs), original.action_space)
    assert all(loaded.action_space.contains(a) for a in actions)
    single = loaded.compute_action(obs[0])
    np.testing.assert_allclose(np.asarray(single), np.asarray(actions[0]), rtol=1e-6, atol=1e-6)
    assert isinstance(loaded.policy, TorchPolicy)
    model = loaded.policy.model
    assert isinstance(model, torch.nn.Module) and not model.training
    assert not any(p.requires_grad for p in model.parameters())
    for name, value in original.get_weights().items():
        np.testing.assert_array_equal(loaded.policy.get_weights()[name], value)


def test_explore_true_samples_and_keeps_the_checkpoints_timestep(tmp_path: Path) -> None:
    policy_map, config = build_policies("ppo", "CartPole-v1")
    policy_map[DEFAULT_POLICY_ID].global_timestep = 12_345
    loaded = load_policy(write_files(tmp_path, policy_map, "ppo", config))
    assert loaded.policy.global_timestep == 12_345
    obs = np.zeros((2000, 4), np.float32)
    sampled = loaded.compute_actions(obs, explore=True)
    assert set(np.unique(sampled)) == {0, 1}  # a stochastic policy with one observation picks both actions
    assert len(np.unique(loaded.compute_actions(obs))) == 1


@pytest.mark.integration
def test_loading_needs_no_ray_and_never_unpickles_state(tmp_path: Path) -> None:
    """In a fresh interpreter (this session may have Ray running): load_policy leaves Ray uninitialized,
    and a state.pkl that would run code on load sits beside the files untouched."""
    checkpoints, expected = [], {}
    for algo, env in CASES[:4]:
        policy_map, config = build_policies(algo, env, seed=1)
        directory = write_files(tmp_path / f"{algo}_{env}", policy_map, algo, config)
        write_malicious_state(directory, tmp_path / f"{algo}_ran")
        obs = observations(policy_map[DEFAULT_POLICY_ID].observation_space, seed=1)
        np.save(directory / "obs.npy", obs)
        checkpoints.append(str(directory))
        expected[str(directory)] = (
            greedy(policy_map[DEFAULT_POLICY_ID], obs),
            policy_map[DEFAULT_POLICY_ID].action_space,
        )
    script = textwrap.dedent(
        """
        import json, sys
        from pathlib import Path
        import numpy as np
        import ray
        import flowrl
        for directory in sys.argv[1:]:
            policy = flowrl.load_policy(directory)
            np.save(Path(directory) / "actions.npy", policy.compute_actions(np.load(Path(directory) / "obs.npy")))
        print("RESULT " + json.dumps({"ray_initialized": ray.is_initialized()}))
        """
    )
    environ = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    command = [sys.executable, "-c", script, *checkpoints]
    proc = subprocess.run(command, check=False, capture_output=True, text=True, timeout=150, cwd=REPO, env=environ)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    assert json.loads(lines[-1][len("RESULT ") :]) == {"ray_initialized": False}
    for path, (actions, space) in expected.items():
        assert_same_actions(np.load(Path(path) / "actions.npy"), actions, space)
    assert not list(tmp_path.glob("*_ran"))  # no state.pkl was unpickled


def test_a_malicious_state_pickle_is_never_loaded(tmp_path: Path) -> None:
    armed = tmp_path / "armed"
    pickle.loads(pickle.dumps(WritesMarker(armed)))
    assert armed.exists()  # the payload works: loading it would leave the marker

    policy_map, config = build_policies("dqn", "CartPole-v1")
    directory = write_files(tmp_path / "checkpoint_000001", policy_map, "dqn", config)
    marker = tmp_path / "ran"
    write_malicious_state(directory, marker)
    loaded = load_policy(directory)
    obs = observations(loaded.observation_space, n=10)
    np.testing.assert_array_equal(loaded.compute_actions(obs), greedy(policy_map[DEFAULT_POLICY_ID], obs))
    assert not marker.exists()


def test_a_run_directory_gives_its_latest_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "ppo_CartPole-v1_2024"
    for iteration, seed in ((1, 1), (2, 2)):
        policy_map, config = build_policies("ppo", "CartPole-v1", seed=seed)
        directory = write_files(run / "checkpoints" / f"checkpoint_{iteration:06d}", policy_map, "ppo", config)
        write_malicious_state(directory, tmp_path / "ran")
    latest = policy_map[DEFAULT_POLICY_ID]
    obs = observations(latest.observation_space)
    np.testing.assert_array_equal(load_policy(run).compute_actions(obs), greedy(latest, obs))
    assert not (tmp_path / "ran").exists()


def test_multi_agent_policies_keep_their_own_config_overrides(tmp_path: Path) -> None:
    overrides = {
        "policies": {"small": {"config": {"model": {"fcnet_hiddens": [8]}, "lr": 0.01}}, "big": None},
        "policy_mapping_fn": by_parity,
    }
    policy_map, config = build_policies("ppo", "MultiAgentCartPole", overrides)
    write_files(tmp_path, policy_map, "ppo", config)
    document = json.loads((tmp_path / POLICIES_JSON).read_text())
    assert document["policies"]["small"]["config"]["model"] == {"fcnet_hiddens": [8]}
    assert document["policies"]["small"]["config"]["lr"] == 0.01
    assert "policy_mapping_fn" not in document["policies"]["small"]["config"]  # run-only: a function
    for pid in ("small", "big"):
        loaded = load_policy(tmp_path, pid)
        obs = observations(loaded.observation_space)
        np.testing.assert_array_equal(loaded.compute_actions(obs), greedy(policy_map[pid], obs))
    small = load_policy(tmp_path, "small").policy.get_weights()
    assert any(v.shape == (8, 4) for v in small.values())


def test_an_algorithm_that_builds_its_policies_together_rebuilds_each(tmp_path: Path) -> None:
    policy_map, config = build_policies("ppo_dqn", "MultiAgentCartPole")
    write_files(tmp_path, policy_map, "ppo_dqn", config)
    for pid in ("ppo_policy", "dqn_policy"):
        loaded = load_policy(tmp_path, pid)
        assert type(loaded.policy.config) is type(policy_map[pid].config)
        obs = observations(loaded.observation_space)
        np.testing.assert_array_equal(loaded.compute_actions(obs), greedy(policy_map[pid], obs))


# -- the file format --------------------------------------------------------------------------


def test_the_files_are_standard_json_and_safetensors(tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    policy_map, config = build_policies("ppo", "CartPole-v1")
    write_files(tmp_path, policy_map, "ppo", config)

    def no_constants(name: str) -> None:
        raise AssertionError(f"{POLICIES_JSON} holds {name}, which standard JSON does not allow")

    document = json.loads((tmp_path / POLICIES_JSON).read_text(), parse_constant=no_constants)
    assert (document["format"], document["format_version"], document["algo"]) == ("flowrl-policies", 1, "ppo")
    entry = document["policies"][DEFAULT_POLICY_ID]
    assert entry["observation_space"]["high"][1] == "inf"  # CartPole's unbounded velocity
    assert entry["action_space"] == {"type": "Discrete", "n": 2, "start": 0, "dtype": "int64"}
    assert entry["config"]["model"] == config.model
    tensors = load_file(tmp_path / POLICIES_WEIGHTS)
    weights = policy_map[DEFAULT_POLICY_ID].get_weights()
    assert set(tensors) == {f"{DEFAULT_POLICY_ID}/{name}" for name in weights}
    for name, value in weights.items():
        assert entry["tensors"][name] == {
            "key": f"{DEFAULT_POLICY_ID}/{name}",
            "dtype": str(value.dtype),
            "shape": list(value.shape),
        }
        np.testing.assert_array_equal(tensors[f"{DEFAULT_POLICY_ID}/{name}"], value)


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.Box(-np.inf, np.inf, (3,), np.float32),
        gym.spaces.Box(np.array([-1.5, 0.0]), np.array([2.0, np.inf]), dtype=np.float64),
        gym.spaces.Box(0, 255, (84, 84, 4), np.uint8),
        gym.spaces.Box(-2.0, 2.0, (1,), np.float32),
        gym.spaces.Discrete(5, start=-2),
        gym.spaces.MultiDiscrete(np.array([[2, 3], [4, 5]])),
        gym.spaces.MultiBinary([2, 3]),
        gym.spaces.MultiBinary(4),
        gym.spaces.Tuple([gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,))]),
        gym.spaces.Dict([("z", gym.spaces.Discrete(2)), ("a", gym.spaces.Box(-1, 1, (2,)))]),
    ],
    ids=repr,
)
def test_spaces_round_trip_through_json(space: gym.Space[Any]) -> None:
    text = json.dumps(space_to_json(space), allow_nan=False)
    rebuilt = space_from_json(json.loads(text))
    assert rebuilt == space and type(rebuilt) is type(space)
    if isinstance(space, gym.spaces.Box):
        assert isinstance(rebuilt, gym.spaces.Box)
        assert (
            rebuilt.dtype == space.dtype
            and np.array_equal(rebuilt.low, space.low)
            and np.array_equal(rebuilt.high, space.high)
        )
    if isinstance(space, gym.spaces.Dict):
        assert isinstance(rebuilt, gym.spaces.Dict)
        assert list(rebuilt.spaces) == list(space.spaces)  # the order a model flattens it in


def test_an_unsupported_space_is_named() -> None:
    with pytest.raises(CheckpointError, match=r"policy 'p': its observation space .*Text.*supported: Box, Discrete"):
        space_to_json(gym.spaces.Text(5), "policy 'p': its observation space")


def test_load_policy_is_flowrls() -> None:
    assert flowrl.load_policy is load_policy and "load_policy" in flowrl.__all__


# -- errors -------------------------------------------------------------------------------


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    policy_map, config = build_policies("ppo", "CartPole-v1")
    return write_files(tmp_path / "checkpoint_000003", policy_map, "ppo", config)


def test_a_checkpoint_without_policies_json_says_so(checkpoint: Path, tmp_path: Path) -> None:
    (checkpoint / POLICIES_JSON).unlink()
    write_malicious_state(checkpoint, tmp_path / "ran")
    with pytest.raises(
        CheckpointError, match=rf"{checkpoint}.*has no {POLICIES_JSON} \(it holds state.pkl.*Trainer.from_checkpoint"
    ):
        load_policy(checkpoint)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_policy(tmp_path / "nowhere")
    empty_run = tmp_path / "run"
    (empty_run / "checkpoints").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="has no complete checkpoint"):
        load_policy(empty_run)
    assert not (tmp_path / "ran").exists()


def test_corrupt_files_are_named(checkpoint: Path) -> None:
    weights = (checkpoint / POLICIES_WEIGHTS).read_bytes()
    (checkpoint / POLICIES_WEIGHTS).write_bytes(weights[:40])
    with pytest.raises(CheckpointError, match=rf"{POLICIES_WEIGHTS}' is corrupt"):
        load_policy(checkpoint)
    (checkpoint / POLICIES_WEIGHTS).write_bytes(weights)
    (checkpoint / POLICIES_JSON).write_text('{"format": "flowrl-policies", "format_ver')
    with pytest.raises(CheckpointError, match=rf"{checkpoint / POLICIES_JSON}' is corrupt: JSONDecodeError"):
        load_policy(checkpoint)


def test_an_unknown_policy_id_lists_the_known_ones(checkpoint: Path) -> None:
    with pytest.raises(CheckpointError, match=r"has no policy 'hero'; its policies are \['default_policy'\]"):
        load_policy(checkpoint, "hero")


def test_weights_that_do_not_fit_the_rebuilt_model_name_both_shapes(checkpoint: Path) -> None:
    document = json.loads((checkpoint / POLICIES_JSON).read_text())
    document["policies"][DEFAULT_POLICY_ID]["config"]["model"] = {"fcnet_hiddens": [32, 32]}
    (checkpoint / POLICIES_JSON).write_text(json.dumps(document))
    with pytest.raises(CheckpointError) as raised:
        load_policy(checkpoint)
    message = str(raised.value)
    assert f"the weights of policy {DEFAULT_POLICY_ID!r} do not fit its model" in message
    assert "has shape (64, 4) in policies.safetensors, but the model rebuilt from policies.json has (32, 4)" in message


def test_a_missing_weight_is_named(checkpoint: Path) -> None:
    document = json.loads((checkpoint / POLICIES_JSON).read_text())
    tensors = document["policies"][DEFAULT_POLICY_ID]["tensors"]
    name = next(iter(tensors))
    tensors["renamed"] = tensors.pop(name)
    (checkpoint / POLICIES_JSON).write_text(json.dumps(document))
    with pytest.raises(CheckpointError, match=rf"the rebuilt model's weight '{name}' .* is not in the checkpoint"):
        load_policy(checkpoint)
