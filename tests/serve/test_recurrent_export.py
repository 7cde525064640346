"""A recurrent policy exported to TorchScript and ONNX takes its state (and previous action and reward) as
inputs and gives the next state as outputs: threaded through 1,000 steps of real StatelessCartPole episodes,
it picks the actions load_policy picks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from policy_files import lstm_policies, write_files

import flowrl
from flowrl.envs import StatelessCartPole
from flowrl.serve.export import export_policy

pytestmark = [
    pytest.mark.unit,
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning"),
]

STEPS = 1000
FORMATS = ("torchscript", "onnx")


class Exported:
    """An exported model run step by step as its description says, the state fed back by the caller."""

    def __init__(self, path: Path) -> None:
        self.description = json.loads(path.with_name(path.name + ".json").read_text())
        self.inputs = [self.description["input"], *self.description["recurrent_inputs"]]
        if self.description["model_format"] == "torchscript":
            self.model = torch.jit.load(str(path))
        else:
            import onnxruntime

            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = 1
            self.session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def initial(self) -> dict[str, np.ndarray]:
        """Every input after the observations at an episode's start: zeros of its dtype and shape, batch 1."""
        return {spec["name"]: np.zeros([1, *spec["shape"][1:]], spec["dtype"]) for spec in self.inputs[1:]}

    def __call__(self, obs: np.ndarray, carried: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed = {self.inputs[0]["name"]: obs[None].astype(self.inputs[0]["dtype"]), **carried}
        values = [feed[spec["name"]] for spec in self.inputs]
        if self.description["model_format"] == "torchscript":
            with torch.no_grad():
                out = [t.numpy() for t in self.model(*(torch.from_numpy(v) for v in values))]
        else:
            out = self.session.run(None, feed)
        return {spec["name"]: value for spec, value in zip(self.description["outputs"], out)}


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One PyTorch thread: a batch of one steps faster without a second one to wake (and on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize(("algo", "seed", "entries", "head"), [("ppo", 3, 4, "logits"), ("r2d2", 1, 2, "q_values")])
def test_exported_recurrent_policies_thread_their_state_as_load_policy(
    tmp_path: Path, algo: str, seed: int, entries: int, head: str
) -> None:
    """LSTM-PPO's actor-critic (greedy: the most likely action) and R2D2's recurrent Q-network (the best Q-value;
    seeded weights that pick both actions)."""
    model = {"fcnet_hiddens": [16], "use_lstm": True, "lstm_cell_size": 8}
    model.update(lstm_use_prev_action=True, lstm_use_prev_reward=True)
    policy_map, config = lstm_policies(model, algo, seed)
    checkpoint = write_files(tmp_path / "checkpoint", policy_map, algo, config)
    loaded = flowrl.load_policy(checkpoint)
    models = [Exported(export_policy(checkpoint, format=format, out=tmp_path / format)) for format in FORMATS]

    for exported in models:
        description = exported.description
        names = [spec["name"] for spec in description["recurrent_inputs"]]
        assert names == [f"state_in_{k}" for k in range(entries)] + ["prev_actions", "prev_rewards"]
        shapes = [spec["shape"] for spec in description["recurrent_inputs"]]
        assert shapes == [["batch", 8]] * entries + [["batch"]] * 2
        outputs = [o["name"] for o in description["outputs"]]
        assert outputs == ["actions", head] + [f"state_out_{k}" for k in range(entries)]

    env = StatelessCartPole()
    obs, _ = env.reset(seed=0)
    state: Any = None
    prev_action: Any = None
    prev_reward: float | None = None
    carried = [exported.initial() for exported in models]
    actions, episodes = [], 0
    for _ in range(STEPS):
        action, state = loaded.compute_action(obs, state, prev_action=prev_action, prev_reward=prev_reward)
        outs = [exported(obs, feed) for exported, feed in zip(models, carried)]
        for exported, out in zip(models, outs):
            assert int(out["actions"][0]) == int(action), exported.description["model_format"]
            for j, entry in enumerate(state):
                np.testing.assert_allclose(out[f"state_out_{j}"][0], entry, rtol=1e-4, atol=1e-5)
        actions.append(int(action))
        obs, reward, terminated, truncated, _ = env.step(int(action))
        prev_action, prev_reward = action, float(reward)
        carried = [
            {
                **{f"state_in_{j}": out[f"state_out_{j}"] for j in range(len(state))},
                "prev_actions": np.asarray([action], np.int64),
                "prev_rewards": np.asarray([reward], np.float32),
            }
            for out in outs
        ]
        if terminated or truncated:
            episodes += 1
            obs, _ = env.reset()
            state, prev_action, prev_reward = None, None, None
            carried = [exported.initial() for exported in models]
    assert episodes > 10 and set(actions) == {0, 1}  # many episode starts, both actions: checks that mean something
