"""The versions a checkpoint records, the warning a restore across versions gives, and an unpickling
failure told apart from damage (no Ray)."""

from __future__ import annotations

import hashlib
import json
import pickle
import sys
import types
from pathlib import Path

import pytest

from flowrl.errors import CheckpointError, RunWarning
from flowrl.storage.checkpoints import COMPLETE_FILE, METADATA_FILE, STATE_FILE, read_checkpoint, write_checkpoint
from flowrl.storage.versions import runtime_versions, version_skew

pytestmark = pytest.mark.unit


def rewrite(path: Path, name: str, data: bytes) -> None:
    """Replace one file of a checkpoint and its entry in the marker, as a writer of that content would have."""
    (path / name).write_bytes(data)
    marker = json.loads((path / COMPLETE_FILE).read_text())
    marker["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (path / COMPLETE_FILE).write_text(json.dumps(marker))


def set_versions(path: Path, **versions: str) -> None:
    metadata = json.loads((path / METADATA_FILE).read_text())
    metadata["versions"] = {**metadata["versions"], **versions}
    rewrite(path, METADATA_FILE, json.dumps(metadata).encode())


def a_pickle_of_a_vanished_class() -> bytes:
    """A state naming a module this process does not have (as one written by another flowrl would)."""
    module = types.ModuleType("flowrl_test_module_of_another_version")
    gone = type("Gone", (), {"__module__": module.__name__})
    setattr(module, "Gone", gone)
    sys.modules[module.__name__] = module
    try:
        return pickle.dumps({"worker": gone()})
    finally:
        del sys.modules[module.__name__]


def test_a_checkpoint_records_the_versions_it_was_written_with(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "checkpoint_000001", {"value": 1}, {"iteration": 1})
    versions = json.loads((path / METADATA_FILE).read_text())["versions"]
    assert set(versions) == {"flowrl", "ray", "torch", "gymnasium", "numpy", "python"}
    assert versions == runtime_versions()
    assert versions["python"] == ".".join(map(str, sys.version_info[:3]))


def test_a_restore_across_a_major_or_a_torch_minor_version_warns_naming_both(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "checkpoint_000001", {"value": 1}, {"iteration": 1})
    torch_now = runtime_versions()["torch"]
    set_versions(path, torch="1.13.1", numpy="0.9.0")
    with pytest.warns(RunWarning) as warned:
        state, _ = read_checkpoint(path)
    assert state == {"value": 1}  # a warning, not a refusal
    [message] = [str(w.message) for w in warned]
    assert f"torch 1.13.1 (checkpoint) vs {torch_now} (here)" in message
    assert "numpy 0.9.0 (checkpoint) vs" in message
    assert message.count("(checkpoint) vs") == 2  # the packages of the same versions are not named


def test_a_patch_or_a_minor_version_of_most_packages_gives_no_warning(
    tmp_path: Path, recwarn: pytest.WarningsRecorder
) -> None:
    path = write_checkpoint(tmp_path / "checkpoint_000001", {"value": 1}, {"iteration": 1})
    now = runtime_versions()
    major_ray = now["ray"].split(".")[0]
    set_versions(path, ray=f"{major_ray}.0.1")
    read_checkpoint(path)
    assert not [w for w in recwarn if issubclass(w.category, RunWarning)]


def test_version_skew_compares_minor_versions_only_for_python_and_torch() -> None:
    now = {"python": "3.11.9", "torch": "2.13.0+cpu", "numpy": "2.1.0", "flowrl": "0.1.0"}
    recorded = {"python": "3.10.14", "torch": "2.12.1", "numpy": "2.3.1", "flowrl": "1.0.0", "gone": "1"}
    assert version_skew(recorded, now) == [
        "python 3.10.14 (checkpoint) vs 3.11.9 (here)",
        "torch 2.12.1 (checkpoint) vs 2.13.0+cpu (here)",
        "flowrl 1.0.0 (checkpoint) vs 0.1.0 (here)",
    ]
    assert version_skew({}, now) == []  # a checkpoint written before versions were recorded


def test_an_unpickling_failure_names_the_versions_and_is_not_called_corrupt(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "checkpoint_000001", {"value": 1}, {"iteration": 1})
    set_versions(path, flowrl="0.0.9")
    rewrite(path, STATE_FILE, a_pickle_of_a_vanished_class())
    with pytest.raises(CheckpointError) as raised:
        read_checkpoint(path)
    message = str(raised.value)
    assert "corrupt" not in message
    assert "No module named 'flowrl_test_module_of_another_version'" in message
    assert "most likely version skew" in message
    assert "The checkpoint's versions: flowrl 0.0.9, ray " in message
    assert f"this process's: flowrl {runtime_versions()['flowrl']}, ray " in message


@pytest.mark.parametrize("damage", ["truncated", "not a pickle"])
def test_a_damaged_pickle_with_matching_checksums_is_still_corrupt(tmp_path: Path, damage: str) -> None:
    path = write_checkpoint(tmp_path / "checkpoint_000001", {"value": "x" * 100}, {"iteration": 1})
    data = (path / STATE_FILE).read_bytes()
    rewrite(path, STATE_FILE, data[: len(data) // 2] if damage == "truncated" else b"\x00garbage")
    with pytest.raises(CheckpointError, match=r"is corrupt: state.pkl: (EOFError|UnpicklingError)") as raised:
        read_checkpoint(path)
    assert "version" not in str(raised.value)
