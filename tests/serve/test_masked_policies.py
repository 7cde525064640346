"""Policies of masked envs outside training: ``load_policy`` and TorchScript/ONNX exports choose legal
actions only (the exported model takes the mask as its second input), and ``load_policy`` refuses a mask that
allows no action."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from policy_files import build_policies, observations, write_files

import flowrl
from flowrl.errors import BadObservationError, EnvError
from flowrl.serve.export import export_policy

pytestmark = [pytest.mark.unit, pytest.mark.timeout(300)]

N = 1000


def random_masks(n: int, seed: int = 0) -> np.ndarray:
    """``n`` random 0/1 masks over 4 actions (int8, as envs give them), each with a legal action."""
    rng = np.random.default_rng(seed)
    masks = (rng.random((n, 4)) < 0.4).astype(np.int8)
    masks[np.arange(n), rng.integers(0, 4, n)] = 1
    return masks


def checkpoint(algo: str, tmp_path: Path, env_config: dict[str, Any] | None = None) -> Path:
    overrides = {"env_config": env_config or {}}
    policy_map, config = build_policies(algo, "MaskedCartPole-v1", overrides)
    return write_files(tmp_path / "checkpoint_000001", policy_map, algo, config)


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_load_policy_chooses_legal_actions_for_masked_observations(algo: str, tmp_path: Path) -> None:
    loaded = flowrl.load_policy(checkpoint(algo, tmp_path))
    assert isinstance(loaded.observation_space, gym.spaces.Dict)
    inner = loaded.observation_space["observations"]
    obs, masks = observations(inner, N), random_masks(N)
    batch = [{"observations": o, "action_mask": m} for o, m in zip(obs, masks)]
    for explore in (False, True):
        actions = loaded.compute_actions(batch, explore=explore)
        assert masks[np.arange(N), actions].all()
    assert all(masks[i, loaded.compute_action(batch[i])] for i in range(50))


def test_load_policy_takes_info_masks_beside_plain_observations(tmp_path: Path) -> None:
    loaded = flowrl.load_policy(checkpoint("dqn", tmp_path, {"mask": "info"}))
    obs, masks = observations(loaded.observation_space, N), random_masks(N)
    assert masks[np.arange(N), loaded.compute_actions(obs, action_mask=masks)].all()
    assert not masks[np.arange(N), loaded.compute_actions(obs)].all()  # greedy, unmasked: illegal somewhere
    assert masks[0, loaded.compute_action(obs[0], action_mask=masks[0])]


def test_load_policy_refuses_a_mask_that_allows_no_action_or_has_the_wrong_shape(tmp_path: Path) -> None:
    loaded = flowrl.load_policy(checkpoint("dqn", tmp_path / "info", {"mask": "info"}))
    obs, masks = observations(loaded.observation_space, 3), random_masks(3)
    masks[1] = 0
    with pytest.raises(BadObservationError, match=r"action_mask\[1\]=\[0, 0, 0, 0\], which allows no action"):
        loaded.compute_actions(obs, action_mask=masks)
    with pytest.raises(BadObservationError, match=r"action_mask\[0\]=\[0, 0, 0, 0\]"):
        loaded.compute_action(obs[0], action_mask=np.zeros(4, np.int8))
    with pytest.raises(EnvError, match=r"action_mask of shape \(3, 3\) .* \(shape \(3, 4\)\)"):
        loaded.compute_actions(obs, action_mask=masks[:, :3])
    in_observations = flowrl.load_policy(checkpoint("ppo", tmp_path / "observation"))
    stuck = {"observations": obs[0], "action_mask": np.zeros(4, np.int8)}
    with pytest.raises(BadObservationError, match="which allows no action"):
        in_observations.compute_action(stuck)


@pytest.mark.parametrize(("algo", "format"), [("ppo", "onnx"), ("dqn", "onnx"), ("dqn", "torchscript")])
def test_exports_take_the_mask_and_choose_legal_actions(algo: str, format: str, tmp_path: Path) -> None:
    path = checkpoint(algo, tmp_path)
    loaded = flowrl.load_policy(path)
    assert isinstance(loaded.observation_space, gym.spaces.Dict)
    obs, masks = observations(loaded.observation_space["observations"], N, seed=3), random_masks(N, seed=3)
    expected = loaded.compute_actions([{"observations": o, "action_mask": m} for o, m in zip(obs, masks)])
    model = export_policy(path, format=format, out=tmp_path / "out")
    legal = masks != 0
    if format == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        assert [i.name for i in session.get_inputs()] == ["obs", "action_mask"]
        actions = session.run(None, {"obs": obs, "action_mask": legal})[0]
    else:
        actions = torch.jit.load(str(model))(torch.as_tensor(obs), torch.as_tensor(legal))[0].numpy()
    assert masks[np.arange(N), actions].all()
    np.testing.assert_array_equal(actions, expected)
    description = json.loads(model.with_name(model.name + ".json").read_text())
    assert description["input"]["shape"] == ["batch", 4]
    assert description["action_mask_input"] == {
        "name": "action_mask",
        "dtype": "bool",
        "shape": ["batch", 4],
        "description": description["action_mask_input"]["description"],
    }
