"""Checkpoints on disk: written atomically, read back with clear errors.

A checkpoint is a directory holding ``state.pkl`` (everything needed to resume) and
``metadata.json`` (what a person wants to read: algorithm, env, iteration, config). It is
written to a temporary sibling directory and renamed into place, so an interrupted save
never leaves a half-written checkpoint where a complete one is expected.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Mapping

import cloudpickle

from flowrl.errors import CheckpointError

STATE_FILE = "state.pkl"
METADATA_FILE = "metadata.json"


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_checkpoint(path: str | Path, state: Mapping[str, Any], metadata: Mapping[str, Any]) -> Path:
    """Write ``state`` and ``metadata`` to the directory ``path`` atomically; returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        _write_file(tmp / STATE_FILE, cloudpickle.dumps(dict(state)))
        _write_file(tmp / METADATA_FILE, json.dumps(dict(metadata), indent=2, default=str).encode())
        if path.exists():
            # Move the old checkpoint aside first: rename cannot replace a non-empty directory.
            old = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(path, old)
            try:
                os.rename(tmp, path)
            except BaseException:
                os.rename(old, path)  # put the previous checkpoint back where it was
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def read_checkpoint(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(state, metadata)`` of the checkpoint at ``path``; raises :class:`CheckpointError` if unusable."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist or is not a directory")
    missing = [name for name in (STATE_FILE, METADATA_FILE) if not (path / name).is_file()]
    if missing:
        raise CheckpointError(f"checkpoint {str(path)!r} is incomplete: missing {', '.join(missing)}")
    try:
        metadata = json.loads((path / METADATA_FILE).read_text())
        with open(path / STATE_FILE, "rb") as f:
            state = cloudpickle.load(f)
    except Exception as e:  # any decoding failure means the files are damaged
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt: {type(e).__name__}: {e}") from e
    if not isinstance(state, dict) or not isinstance(metadata, dict):
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt: unexpected contents")
    return state, metadata


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The complete checkpoint with the highest iteration under ``directory`` (None if there is none)."""
    candidates = sorted(p for p in Path(directory).glob("checkpoint_*") if (p / METADATA_FILE).is_file())
    return candidates[-1] if candidates else None
