"""Policies exported as TorchScript and ONNX models act as the checkpoint's policy does, loaded with torch or
onnxruntime alone.

Trained checkpoints (PPO, DQN, TD3; one tiny iteration each) are checked in a fresh interpreter that
never imports flowrl, Ray or Gymnasium. The other kinds of policy (Gaussian, deterministic actors,
ES/ARS, IMPALA, discrete observations, multi-agent) are built without Ray and given random weights,
as in test_inference.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from policy_files import build_policies, observations, write_files

import flowrl
from flowrl.cli.main import main
from flowrl.data import DEFAULT_POLICY_ID
from flowrl.errors import CheckpointError, RunError
from flowrl.serve.export import export_policy, find_checkpoint
from flowrl.serve.inference import policy_files
from flowrl.storage.checkpoints import write_checkpoint

pytestmark = [
    pytest.mark.unit,
    pytest.mark.timeout(300),
    # Loading a TorchScript model is what these tests do; PyTorch 2.13 deprecates it in favour of torch.export.
    pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning"),
]

FORMATS = ("torchscript", "onnx")
TRAINED = {
    "ppo": (
        "CartPole-v1",
        {"rollout_fragment_length": 100, "train_batch_size": 200, "sgd_minibatch_size": 50, "num_sgd_iter": 2},
    ),
    "dqn": ("CartPole-v1", {"learning_starts": 100, "timesteps_per_iteration": 200, "train_batch_size": 32}),
    "td3": (
        "Pendulum-v1",
        {
            "learning_starts": 100,
            "timesteps_per_iteration": 200,
            "train_batch_size": 32,
            "actor_hiddens": [64, 64],
            "critic_hiddens": [64, 64],
        },
    ),
}


def run_exported(path: Path, obs: np.ndarray) -> list[np.ndarray]:
    """The exported model's outputs for ``obs``, cast to the input dtype its description gives."""
    description = json.loads(path.with_name(path.name + ".json").read_text())
    batch = obs.astype(description["input"]["dtype"])
    if description["model_format"] == "torchscript":
        with torch.no_grad():
            return [t.numpy() for t in torch.jit.load(str(path))(torch.from_numpy(batch))]
    import onnxruntime

    return list(onnxruntime.InferenceSession(str(path)).run(None, {description["input"]["name"]: batch}))


def sample_observations(space: gym.Space[Any], n: int = 1000, seed: int = 0) -> np.ndarray:
    if isinstance(space, gym.spaces.Box):
        return observations(space, n, seed)
    space.seed(seed)
    return np.array([space.sample() for _ in range(n)])


# -- trained checkpoints, checked without flowrl, Ray or Gymnasium ------------------------------


@pytest.fixture(scope="module")
def trained(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """A checkpoint of each algorithm of TRAINED after one training iteration."""
    checkpoints = {}
    for algo, (env, config) in TRAINED.items():
        trainer = flowrl.Trainer(algo, env, {"num_workers": 0, "seed": 0, **config})
        try:
            trainer.train()
            checkpoints[algo] = Path(trainer.save(tmp_path_factory.mktemp(algo)))
        finally:
            trainer.stop()
    yield checkpoints


def test_exports_of_trained_policies_act_as_load_policy_without_flowrl_or_ray(
    trained: dict[str, Path], tmp_path: Path
) -> None:
    models, expected = [], {}
    for algo, checkpoint in trained.items():
        policy = flowrl.load_policy(checkpoint)
        obs = observations(policy.observation_space, 1000)
        actions = policy.compute_actions(obs)
        if isinstance(policy.action_space, gym.spaces.Discrete):
            assert len(np.unique(actions)) > 1  # a comparison that means something
        for format in FORMATS:
            model = export_policy(checkpoint, format=format, out=tmp_path / algo)
            np.save(model.with_name(model.name + ".obs.npy"), obs)
            models.append(str(model))
            expected[str(model)] = actions
    script = textwrap.dedent(
        """
        import json, sys
        import numpy as np
        for path in sys.argv[1:]:
            description = json.loads(open(path + ".json").read())
            obs = np.load(path + ".obs.npy").astype(description["input"]["dtype"])
            if description["model_format"] == "torchscript":
                import torch
                outputs = [t.numpy() for t in torch.jit.load(path)(torch.from_numpy(obs))]
            else:
                import onnxruntime
                outputs = onnxruntime.InferenceSession(path).run(None, {description["input"]["name"]: obs})
            np.save(path + ".actions.npy", outputs[0])
        print("RESULT " + json.dumps({name: name in sys.modules for name in ("flowrl", "ray", "gymnasium")}))
        """
    )
    environ = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run(
        [sys.executable, "-c", script, *models],
        check=False,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env=environ,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    assert json.loads(lines[-1][len("RESULT ") :]) == {"flowrl": False, "ray": False, "gymnasium": False}
    for model, actions in expected.items():
        got = np.load(model + ".actions.npy")
        assert got.shape == actions.shape and got.dtype == actions.dtype, model
        if actions.dtype.kind == "f":
            np.testing.assert_allclose(got, actions, rtol=1e-5, atol=1e-5, err_msg=model)
        else:
            np.testing.assert_array_equal(got, actions, err_msg=model)


def test_the_description_says_what_goes_in_and_comes_out(trained: dict[str, Path], tmp_path: Path) -> None:
    model = export_policy(trained["dqn"], format="onnx", out=tmp_path)
    assert model == tmp_path / "default_policy.onnx"
    description = json.loads((tmp_path / "default_policy.onnx.json").read_text())
    assert description["format"] == "flowrl-export" and description["model_format"] == "onnx"
    assert (description["algo"], description["policy_id"], description["model_file"]) == (
        "dqn",
        DEFAULT_POLICY_ID,
        model.name,
    )
    assert description["checkpoint"] == str(trained["dqn"].resolve())
    assert description["input"] | {"description": ""} == {
        "name": "obs",
        "dtype": "float32",
        "shape": ["batch", 4],
        "description": "",
    }
    outputs = [(o["name"], o["dtype"], o["shape"]) for o in description["outputs"]]
    assert outputs == [("actions", "int64", ["batch"]), ("q_values", "float32", ["batch", 2])]
    assert description["action_space"] == {"type": "Discrete", "n": 2, "start": 0, "dtype": "int64"}
    assert description["observation_space"]["shape"] == [4]

    import onnxruntime

    session = onnxruntime.InferenceSession(str(model))
    assert [(i.name, i.shape) for i in session.get_inputs()] == [("obs", ["batch", 4])]
    assert [o.name for o in session.get_outputs()] == ["actions", "q_values"]
    q_values = flowrl.load_policy(trained["dqn"]).policy.model(torch.zeros(1, 4))[0].detach().numpy()
    np.testing.assert_allclose(
        session.run(None, {"obs": np.zeros((1, 4), np.float32)})[1], q_values, rtol=1e-5, atol=1e-6
    )


# -- every kind of policy ------------------------------------------------------------------------

KINDS = [
    # (algorithm, env, config overrides, the outputs after "actions")
    ("pg", "CartPole-v1", {}, ["logits"]),
    ("impala", "CartPole-v1", {"num_workers": 1}, ["logits"]),
    ("appo", "CartPole-v1", {"num_workers": 1}, ["logits"]),
    ("ppo", "FrozenLake-v1", {}, ["logits"]),  # Discrete observations: indices in, one-hot inside the model
    ("dqn", "CartPole-v1", {"dueling": False, "double_q": False}, ["q_values"]),
    ("apex", "CartPole-v1", {"num_workers": 1}, ["q_values"]),
    ("ppo", "Pendulum-v1", {}, ["mean", "log_std"]),
    ("ppo", "Pendulum-v1", {"clip_actions": False}, ["mean", "log_std"]),
    ("ddpg", "Pendulum-v1", {}, []),
    ("sac", "Pendulum-v1", {}, ["mean", "log_std"]),  # tanh of the mean into the bounds
    ("sac", "CartPole-v1", {}, ["logits"]),
    ("es", "CartPole-v1", {}, ["logits"]),
    ("ars", "Pendulum-v1", {}, []),
]


@pytest.mark.parametrize("format", FORMATS)
@pytest.mark.parametrize(("algo", "env", "overrides", "extra_outputs"), KINDS, ids=lambda v: str(v) if v else "-")
def test_each_kind_of_policy_exports_its_greedy_actions(
    algo: str, env: str, overrides: dict[str, Any], extra_outputs: list[str], format: str, tmp_path: Path
) -> None:
    policy_map, config = build_policies(algo, env, overrides)
    checkpoint = write_files(tmp_path / "checkpoint_000001", policy_map, algo, config)
    loaded = flowrl.load_policy(checkpoint)
    obs = sample_observations(loaded.observation_space)
    expected = loaded.compute_actions(obs)

    model = export_policy(checkpoint, format=format, out=tmp_path / "out")
    outputs = run_exported(model, obs)
    description = json.loads(model.with_name(model.name + ".json").read_text())
    assert [o["name"] for o in description["outputs"]] == ["actions", *extra_outputs]
    assert len(outputs) == len(extra_outputs) + 1
    actions = outputs[0]
    assert actions.shape == expected.shape and actions.dtype == expected.dtype
    if isinstance(loaded.action_space, gym.spaces.Discrete):
        np.testing.assert_array_equal(actions, expected)
        assert len(np.unique(expected)) > 1
    else:
        # Weights drawn from N(0, 1) give pre-activations in the hundreds: float32 sums taken in
        # another order (ONNX Runtime's kernels) differ in the fourth decimal.
        np.testing.assert_allclose(actions, expected, rtol=1e-4, atol=1e-3)
    if overrides.get("clip_actions") is False:
        assert not loaded.action_space.contains(expected.max(axis=0))  # unclipped means leave the bounds
    if extra_outputs == ["mean", "log_std"]:  # the actions are the means, clipped unless clip_actions is off
        space = loaded.action_space
        assert isinstance(space, gym.spaces.Box)
        means = outputs[1] if overrides.get("clip_actions") is False else np.clip(outputs[1], space.low, space.high)
        if algo == "sac":  # SAC's deterministic action is the mean squashed by tanh into the bounds
            means = space.low + (np.tanh(outputs[1]) + 1.0) * 0.5 * (space.high - space.low)
        np.testing.assert_allclose(means, expected, rtol=1e-4, atol=1e-3)
    one = run_exported(model, obs[:1])[0]  # the batch dimension is dynamic, down to one row
    assert one.shape == expected[:1].shape


def test_each_policy_of_a_multi_agent_checkpoint_exports_on_its_own(tmp_path: Path) -> None:
    policy_map, config = build_policies("ppo_dqn", "MultiAgentCartPole")
    checkpoint = write_files(tmp_path / "checkpoint_000001", policy_map, "ppo_dqn", config)
    with pytest.raises(RunError, match=r"holds the policies \['dqn_policy', 'ppo_policy'\]: choose .*--policy ID"):
        export_policy(checkpoint, out=tmp_path / "out")
    for policy_id, values in (("ppo_policy", "logits"), ("dqn_policy", "q_values")):
        model = export_policy(checkpoint, out=tmp_path / "out", policy_id=policy_id)
        assert model == tmp_path / "out" / f"{policy_id}.pt"
        loaded = flowrl.load_policy(checkpoint, policy_id)
        obs = observations(loaded.observation_space)
        actions, _ = run_exported(model, obs)
        np.testing.assert_array_equal(actions, loaded.compute_actions(obs))
        assert json.loads((tmp_path / "out" / f"{policy_id}.pt.json").read_text())["outputs"][1]["name"] == values
    with pytest.raises(CheckpointError, match="has no policy 'hero'"):
        export_policy(checkpoint, out=tmp_path / "out", policy_id="hero")


# -- run directories, checkpoints and errors -----------------------------------------------------


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run directory with checkpoints 1 and 2, their policies drawn with different seeds."""
    run = tmp_path / "ppo_CartPole-v1_20240101-000000"
    run.mkdir(parents=True)
    (run / "params.json").write_text(json.dumps({"algo": "ppo", "env": "CartPole-v1", "config": {}}))
    for iteration in (1, 2):
        policy_map, config = build_policies("ppo", "CartPole-v1", seed=iteration)
        write_checkpoint(
            run / "checkpoints" / f"checkpoint_{iteration:06d}",
            {},
            {"algo": "ppo", "iteration": iteration},
            policy_files(policy_map, "ppo", config),
        )
    return run


def test_a_run_directory_exports_its_latest_or_the_chosen_checkpoint(run_dir: Path) -> None:
    latest = export_policy(run_dir)
    assert latest == run_dir / "exports" / "checkpoint_000002" / "default_policy.pt"
    first = export_policy(run_dir, checkpoint=1)
    assert first == run_dir / "exports" / "checkpoint_000001" / "default_policy.pt"
    obs = observations(gym.spaces.Box(-5, 5, (4,), np.float32))
    for model, number in ((latest, 2), (first, 1)):
        expected = flowrl.load_policy(run_dir / "checkpoints" / f"checkpoint_{number:06d}").compute_actions(obs)
        np.testing.assert_array_equal(run_exported(model, obs)[0], expected)
    assert not np.array_equal(run_exported(latest, obs)[1], run_exported(first, obs)[1])
    assert (
        find_checkpoint(run_dir / "checkpoints" / "checkpoint_000001") == run_dir / "checkpoints" / "checkpoint_000001"
    )


def test_checkpoint_and_format_errors_name_what_would_work(run_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"has no complete checkpoint 7; its checkpoints are \[1, 2\]"):
        export_policy(run_dir, checkpoint=7)
    with pytest.raises(CheckpointError, match="is a checkpoint directory; checkpoint 1 picks one of a run directory's"):
        export_policy(run_dir / "checkpoints" / "checkpoint_000001", checkpoint=1)
    with pytest.raises(CheckpointError, match="does not exist"):
        export_policy(tmp_path / "nowhere")
    with pytest.raises(RunError, match="export format 'tflite' is not one of torchscript, onnx"):
        export_policy(run_dir, format="tflite")


def test_onnx_without_its_packages_asks_for_the_export_extra(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime raises ImportError
    with pytest.raises(
        RunError, match=r"needs the optional dependency onnxruntime .*pip install 'flowrl-ray\[export\]'"
    ):
        export_policy(run_dir, format="onnx")
    assert export_policy(run_dir, format="torchscript").is_file()  # TorchScript needs only torch


def test_cli_export(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "served"
    assert main(["export", str(run_dir), "--checkpoint", "1", "--format", "onnx", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"model: {out / 'default_policy.onnx'}" in printed
    assert "input: obs float32[batch, 4]; outputs: actions int64[batch], logits float32[batch, 2]" in printed
    assert (out / "default_policy.onnx.json").is_file()

    assert main(["export", str(run_dir), "--checkpoint", "9", "--format", "torchscript"]) == 2
    assert "has no complete checkpoint 9; its checkpoints are [1, 2]" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: --format is required and has two choices
        main(["export", str(run_dir), "--format", "pickle"])


def dict_observation_policy() -> tuple[dict[str, Any], Any]:
    """A PPO policy (random weights) on a Dict observation space, built without an env."""
    from flowrl.algorithms import get_algorithm

    algorithm = get_algorithm("ppo")
    config = algorithm.config_class.from_dict({"num_workers": 0, "seed": 0}).frozen()
    space = gym.spaces.Dict({"position": gym.spaces.Box(-1, 1, (3,), np.float32), "mode": gym.spaces.Discrete(3)})
    policy = algorithm.make_policy(space, gym.spaces.Discrete(4), config).build()
    rng = np.random.default_rng(0)
    policy.set_weights({k: rng.normal(0, 1.0, v.shape).astype(v.dtype) for k, v in policy.get_weights().items()})
    return {DEFAULT_POLICY_ID: policy}, config


@pytest.mark.parametrize("format", FORMATS)
def test_the_observation_filter_and_flattened_dict_observations_are_part_of_the_model(
    format: str, tmp_path: Path
) -> None:
    from gymnasium.spaces.utils import flatten

    from flowrl.policy.filters import MeanStdFilter

    # A run with observation_filter: MeanStdFilter: its statistics travel in policies.json.
    policy_map, config = build_policies("ppo", "CartPole-v1")
    obs_filter = MeanStdFilter()
    obs_filter(np.random.default_rng(1).normal(3.0, 2.0, size=(500, 4)))
    checkpoint = tmp_path / "filtered"
    checkpoint.mkdir()
    for name, data in policy_files(policy_map, "ppo", config, observation_filter=obs_filter).items():
        (checkpoint / name).write_bytes(data)
    loaded = flowrl.load_policy(checkpoint)
    obs = np.random.default_rng(2).normal(3.0, 2.0, size=(1000, 4)).astype(np.float32)
    expected = loaded.compute_actions(obs)
    assert not np.array_equal(
        expected, policy_map[DEFAULT_POLICY_ID].compute_actions(obs, explore=False)[0]
    )  # it matters
    model = export_policy(checkpoint, format=format, out=tmp_path / "out")
    np.testing.assert_array_equal(run_exported(model, obs)[0], expected)
    assert (
        json.loads(model.with_name(model.name + ".json").read_text())["observation_filter"]["type"] == "MeanStdFilter"
    )

    # Dict observations: the model takes them flattened, as gymnasium.spaces.utils.flatten gives them.
    policy_map, config = dict_observation_policy()
    checkpoint = write_files(tmp_path / "dict", policy_map, "ppo", config)
    loaded = flowrl.load_policy(checkpoint)
    space = loaded.observation_space
    space.seed(0)
    samples = [space.sample() for _ in range(1000)]
    expected = loaded.compute_actions(samples)
    model = export_policy(checkpoint, format=format, out=tmp_path / "out_dict")
    flat = np.stack([flatten(space, sample) for sample in samples])
    np.testing.assert_array_equal(run_exported(model, flat)[0], expected)
    assert len(np.unique(expected)) > 1
    assert json.loads(model.with_name(model.name + ".json").read_text())["input"]["shape"] == ["batch", 6]


FIXED_BATCH_MODEL = '''
import torch
from torch import nn


class FixedBatch(nn.Module):
    """An actor-critic that turns the batch size into a Python int: a trace keeps the one it saw."""

    def __init__(self, obs_space, action_space, num_outputs):
        super().__init__()
        self.net = nn.Linear(4, num_outputs + 1)

    def forward(self, obs):
        out = self.net(obs.reshape(int(obs.shape[0]), 4))
        return out[:, :-1], out[:, -1]
'''


@pytest.mark.parametrize("format", FORMATS)
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")  # the warning is the point: the trace keeps a constant
def test_a_model_that_does_not_trace_faithfully_is_refused(
    format: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "fixed_batch_model.py").write_text(FIXED_BATCH_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    policy_map, config = build_policies(
        "ppo", "CartPole-v1", {"model": {"custom_model": "fixed_batch_model:FixedBatch"}}
    )
    checkpoint = write_files(tmp_path / "checkpoint_000001", policy_map, "ppo", config)
    with pytest.raises(
        RunError, match=f"the exported {format} model does not compute what the policy does on a batch of 17"
    ):
        export_policy(checkpoint, format=format, out=tmp_path / "out", allow_imports=["fixed_batch_model"])
    assert not list((tmp_path / "out").iterdir())  # nothing half-right is left behind
