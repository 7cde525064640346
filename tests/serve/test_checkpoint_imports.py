"""Loading a checkpoint imports nothing it names unless allowed: ``load_policy``, ``export_policy``, the
evaluation of a checkpoint's files, and ``flowrl evaluate`` / ``flowrl export`` with ``--allow-import``.

The checkpoints are written without training (random weights, Ray-free), then their ``policies.json``
is made to name a module ``planted`` (beside them) that leaves a marker file when it is imported.
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

import numpy as np
import pytest
import safetensors.numpy
from policy_files import build_policies

from flowrl.cli.main import main
from flowrl.data import DEFAULT_POLICY_ID
from flowrl.errors import CheckpointError
from flowrl.policy import TorchPolicy
from flowrl.serve.evaluate import evaluate_policy_files
from flowrl.serve.export import export_policy
from flowrl.serve.inference import POLICIES_JSON, POLICIES_WEIGHTS, load_policy, policy_files
from flowrl.storage.checkpoints import write_checkpoint

pytestmark = [pytest.mark.unit, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
PLANTED = "planted"
MARKER = "planted.marker"
#: A module a checkpoint names: each of its names fits one config key, and importing it leaves MARKER beside it.
PLANTED_SOURCE = textwrap.dedent(
    """
    from pathlib import Path

    import torch

    from flowrl.callbacks import Callbacks

    Path(__file__).with_name("planted.marker").write_text("imported")


    class PlantedCallbacks(Callbacks):
        pass


    def mapping(agent_id):
        return "default_policy"


    def by_parity(agent_id):
        return "small" if agent_id % 2 == 0 else "big"


    class Model(torch.nn.Module):
        def __init__(self, obs_space, action_space, num_outputs):
            super().__init__()
            self.pi = torch.nn.Linear(4, num_outputs)
            self.v = torch.nn.Linear(4, 1)

        def forward(self, obs):
            return self.pi(obs), self.v(obs).squeeze(-1)
    """
)
#: The config key a checkpoint sets to a name in the planted module (model.custom_model inside ``model``).
KEYS = {
    "callbacks": f"{PLANTED}:PlantedCallbacks",
    "policy_mapping_fn": f"{PLANTED}:mapping",
    "model.custom_model": f"{PLANTED}:Model",
}
#: The planted Model's weights, which a checkpoint naming it holds instead of the built-in model's.
MODEL_WEIGHTS = {"pi.weight": (2, 4), "pi.bias": (2,), "v.weight": (1, 4), "v.bias": (1,)}


@pytest.fixture(scope="module")
def files() -> dict[str, bytes]:
    """A PPO CartPole policy's portable files (random weights, nothing trained)."""
    policy_map, config = build_policies("ppo", "CartPole-v1", {"model": {"fcnet_hiddens": [8]}})
    return policy_files(policy_map, "ppo", config)


def planted_checkpoint(
    directory: Path, files: dict[str, bytes], key: str | None, env: str = "CartPole-v1", mapping: str | None = None
) -> Path:
    """``directory/checkpoint_000001`` whose policies.json sets ``key`` to a name in the planted module
    (``None``: none), with ``planted.py`` in ``directory``; metadata.json names ``env`` and ``mapping``."""
    document = json.loads(files[POLICIES_JSON])
    weights = files[POLICIES_WEIGHTS]
    entry = document["policies"].get(DEFAULT_POLICY_ID, {})
    if key == "model.custom_model":
        entry["config"]["model"]["custom_model"] = KEYS[key]
        arrays = {f"{DEFAULT_POLICY_ID}/{name}": np.zeros(shape, np.float32) for name, shape in MODEL_WEIGHTS.items()}
        weights = safetensors.numpy.save(arrays)
        entry["tensors"] = {
            name: {"key": f"{DEFAULT_POLICY_ID}/{name}", "dtype": "float32", "shape": list(shape)}
            for name, shape in MODEL_WEIGHTS.items()
        }
    elif key is not None:
        entry["config"][key] = KEYS[key]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{PLANTED}.py").write_text(PLANTED_SOURCE)
    metadata = {"algo": "ppo", "env": env, "iteration": 1, "config": {"env_config": {}, "policy_mapping_fn": mapping}}
    contents = {POLICIES_JSON: json.dumps(document).encode(), POLICIES_WEIGHTS: weights}
    return write_checkpoint(directory / "checkpoint_000001", {}, metadata, contents)


@pytest.fixture
def importable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``tmp_path`` on ``sys.path``, where ``import planted`` would find the planted module; forgotten after."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop(PLANTED, None)


@pytest.mark.parametrize("key", list(KEYS))
def test_a_module_the_checkpoint_names_is_not_imported_unless_allowed(
    key: str, importable: Path, files: dict[str, bytes]
) -> None:
    checkpoint = planted_checkpoint(importable, files, key)
    expected = rf"config key '{key}' names the module 'planted'.*allow_imports=\['planted'\].*--allow-import planted"
    for load in (lambda: load_policy(checkpoint), lambda: export_policy(checkpoint, out=importable / "out")):
        with pytest.raises(CheckpointError, match=expected):
            load()
    with pytest.raises(CheckpointError, match=expected):
        load_policy(checkpoint, allow_imports=["plant", "planted_extra", "other.planted"])  # none of them is planted
    assert PLANTED not in sys.modules and not (importable / MARKER).exists()

    policy = load_policy(checkpoint, allow_imports=[PLANTED])
    assert (importable / MARKER).exists()
    assert policy.action_space.contains(policy.compute_action(np.zeros(4, np.float32)))
    if key == "model.custom_model":
        assert isinstance(policy.policy, TorchPolicy) and type(policy.policy.model).__module__ == PLANTED


def test_allowing_a_package_allows_its_submodules_only(importable: Path, files: dict[str, bytes]) -> None:
    document = json.loads(files[POLICIES_JSON])
    document["policies"][DEFAULT_POLICY_ID]["config"]["policy_mapping_fn"] = "pkg.sub:mapping"
    package = importable / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "sub.py").write_text("def mapping(agent_id):\n    return 'default_policy'\n")
    checkpoint = write_checkpoint(
        importable / "checkpoint_000001", {}, {}, {**files, POLICIES_JSON: json.dumps(document).encode()}
    )
    try:
        with pytest.raises(CheckpointError, match="'policy_mapping_fn' names the module 'pkg.sub'"):
            load_policy(checkpoint, allow_imports=["pkg.other", "pk"])
        assert "pkg" not in sys.modules
        assert load_policy(checkpoint, allow_imports=["pkg"]).policy_id == DEFAULT_POLICY_ID
        assert "pkg.sub" in sys.modules
    finally:
        sys.modules.pop("pkg.sub", None)
        sys.modules.pop("pkg", None)


def test_evaluating_a_checkpoints_files_imports_nothing_it_names(importable: Path, files: dict[str, bytes]) -> None:
    clean = planted_checkpoint(importable / "clean", files, None)
    stats = evaluate_policy_files(clean, num_episodes=2, seed=0)
    assert (stats["algo"], stats["env"], stats["iteration"], stats["episodes"]) == ("ppo", "CartPole-v1", 1, 2)
    assert stats["episode_len_mean"] >= 1

    with pytest.raises(CheckpointError, match="config key 'callbacks' names the module 'planted'"):
        evaluate_policy_files(planted_checkpoint(importable / "callbacks", files, "callbacks"), num_episodes=1)
    # A Gymnasium id "module:EnvId" would import its module to register the env.
    with pytest.raises(CheckpointError, match=r"metadata.json'.*config key 'env' names the module 'planted'"):
        evaluate_policy_files(planted_checkpoint(importable / "env", files, None, env="planted:Env-v0"), num_episodes=1)
    assert PLANTED not in sys.modules and not list(importable.rglob(MARKER))


@pytest.mark.parametrize("mapping", ["planted:by_parity", "no_such_module:mapping", "<function <lambda> at 0x1>"])
def test_a_single_policy_checkpoint_evaluates_whatever_mapping_its_metadata_names(
    mapping: str, importable: Path, files: dict[str, bytes]
) -> None:
    # One policy plays every agent: the run's mapping is neither needed nor imported.
    checkpoint = planted_checkpoint(importable, files, None, mapping=mapping)
    stats = evaluate_policy_files(checkpoint, num_episodes=1, seed=0)
    assert (stats["algo"], stats["episodes"]) == ("ppo", 1) and stats["episode_len_mean"] >= 1
    assert PLANTED not in sys.modules and not list(importable.rglob(MARKER))


def test_a_multi_agent_checkpoint_is_evaluated_with_its_mapping_path_when_allowed(importable: Path) -> None:
    overrides = {
        "policies": {"small": {"config": {"model": {"fcnet_hiddens": [8]}}}, "big": None},
        "policy_mapping_fn": lambda agent_id: "small" if agent_id % 2 == 0 else "big",  # metadata.json names one
    }
    policy_map, config = build_policies("ppo", "MultiAgentCartPole", overrides)
    files = policy_files(policy_map, "ppo", config)
    checkpoint = planted_checkpoint(importable, files, None, env="MultiAgentCartPole", mapping="planted:by_parity")
    with pytest.raises(CheckpointError, match="metadata.json'.*config key 'policy_mapping_fn' names the module"):
        evaluate_policy_files(checkpoint, num_episodes=1)
    assert PLANTED not in sys.modules

    stats = evaluate_policy_files(checkpoint, num_episodes=1, seed=0, allow_imports=[PLANTED])
    assert set(stats["policy_reward_mean"]) == {"small", "big"}
    # A mapping given as a Python function is in metadata.json as its repr only.
    function = planted_checkpoint(importable / "function", files, None, "MultiAgentCartPole", "<function f at 0x1>")
    with pytest.raises(CheckpointError, match=r"policy_mapping_fn='<function f at 0x1>', which metadata.json cannot"):
        evaluate_policy_files(function, num_episodes=1, allow_imports=[PLANTED])


def test_flowrl_evaluate_and_export_take_allow_import(
    importable: Path, files: dict[str, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = planted_checkpoint(importable, files, "callbacks")
    export = ["export", str(checkpoint), "--format", "torchscript", "--out", str(importable / "out")]
    for argv in (["evaluate", str(checkpoint), "--episodes", "1"], export):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("flowrl: error: ") and err.count("\n") == 1, err
        assert "config key 'callbacks' names the module 'planted'" in err
    assert PLANTED not in sys.modules

    assert (
        main(["evaluate", str(checkpoint), "--episodes", "1", "--allow-import", "other", "--allow-import", PLANTED])
        == 0
    )
    assert "1 episode, deterministic actions" in capsys.readouterr().out
    assert main([*export, "--allow-import", PLANTED]) == 0
    assert (importable / "out" / "default_policy.pt").is_file()


@pytest.mark.integration
def test_a_module_planted_in_the_working_directory_never_runs(tmp_path: Path, files: dict[str, bytes]) -> None:
    """In a fresh interpreter whose working directory holds ``planted.py`` (so ``import planted`` would find
    it): every key and entry point refuses it before importing it; allowed, it is imported."""
    for key in KEYS:
        planted_checkpoint(tmp_path / key.replace(".", "_"), files, key)
    script = textwrap.dedent(
        """
        import contextlib, io, json, os, shutil, sys
        from pathlib import Path
        import flowrl
        from flowrl.cli.main import main
        from flowrl.errors import CheckpointError

        def refusals(checkpoint):
            try:
                flowrl.load_policy(checkpoint)
                found = ["load_policy: loaded"]
            except CheckpointError as e:
                found = [str(e)]
            for argv in (["evaluate", checkpoint, "--episodes", "1"],
                         ["export", checkpoint, "--format", "torchscript", "--out", "out"]):
                err = io.StringIO()
                with contextlib.redirect_stderr(err):
                    code = main(argv)
                found.append([code, err.getvalue()])
            return found

        report = {}
        for key in sys.argv[1:]:
            os.chdir(key)
            checkpoint = "checkpoint_000001"
            refused = refusals(checkpoint)
            state = {"marker": Path("planted.marker").exists(), "imported": "planted" in sys.modules}
            policy = flowrl.load_policy(checkpoint, allow_imports=["planted"])
            allowed = {"marker": Path("planted.marker").exists(), "imported": "planted" in sys.modules}
            sys.modules.pop("planted")
            os.chdir("..")
            report[key] = {"refused": refused, "after_refusals": state, "after_allowed": allowed}
        print("RESULT " + json.dumps(report))
        """
    )
    keys = [key.replace(".", "_") for key in KEYS]
    environ = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    command = [sys.executable, "-c", script, *keys]
    proc = subprocess.run(command, check=False, capture_output=True, text=True, timeout=240, cwd=tmp_path, env=environ)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    for key in KEYS:
        found = report[key.replace(".", "_")]
        message, evaluate, export = found["refused"]
        assert f"config key '{key}' names the module 'planted'" in message
        for code, err in (evaluate, export):
            assert code == 2 and err.startswith("flowrl: error: ") and err.count("\n") == 1, err
            assert f"config key '{key}' names the module 'planted'" in err and "--allow-import planted" in err
        assert found["after_refusals"] == {"marker": False, "imported": False}
        assert found["after_allowed"] == {"marker": True, "imported": True}
