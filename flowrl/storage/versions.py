"""The versions of flowrl and of what its pickles depend on, recorded in checkpoints and compared on restore.

A checkpoint's ``metadata.json`` holds :func:`runtime_versions` under ``"versions"``.
:func:`version_skew` says which of them differ enough from this process's that a pickle may not
load, or may not behave the same: another major version of any package, and for Python and
PyTorch another minor version too (their pickles change between minor releases).
"""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import re
from collections.abc import Mapping
from typing import Any

from flowrl._version import __version__

#: The distributions whose versions a checkpoint records (flowrl's own comes from flowrl._version).
PACKAGES = ("ray", "torch", "gymnasium", "numpy")
#: Where the minor version counts too: their pickles can break between minor releases.
MINOR_MATTERS = frozenset({"python", "torch"})

_RELEASE = re.compile(r"(\d+)(?:\.(\d+))?")


def runtime_versions() -> dict[str, str]:
    """This process's versions of flowrl, Ray, PyTorch, Gymnasium, NumPy and Python (name -> version).

    A package that is not installed is left out. Nothing is imported to read them; they are read
    once a process, and each call returns a fresh dict.
    """
    return dict(_runtime_versions())


@functools.cache
def _runtime_versions() -> dict[str, str]:
    versions = {"flowrl": __version__}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    versions["python"] = platform.python_version()
    return versions


def _release(version: str, parts: int) -> tuple[int, ...] | None:
    match = _RELEASE.match(version)
    if match is None:
        return None
    numbers = tuple(int(n) for n in match.groups(default="0"))
    return numbers[:parts]


def version_skew(recorded: Mapping[str, Any], current: Mapping[str, str]) -> list[str]:
    """The packages whose ``recorded`` and ``current`` versions differ in a way a pickle may not survive.

    Each item names the package and both versions: ``"torch 1.13.1 (checkpoint) vs 2.13.0 (here)"``.
    Packages missing on either side, or whose versions cannot be read, are not compared.
    """
    found = []
    for name, now in current.items():
        then = recorded.get(name)
        if not isinstance(then, str):
            continue
        parts = 2 if name in MINOR_MATTERS else 1
        old, new = _release(then, parts), _release(now, parts)
        if old is not None and new is not None and old != new:
            found.append(f"{name} {then} (checkpoint) vs {now} (here)")
    return found


def describe_versions(versions: Mapping[str, Any] | None) -> str:
    """``"flowrl 0.1.0, ray 2.60.0, ..."``; for a checkpoint that recorded none, says so."""
    if not versions:
        return "not recorded (written before flowrl recorded them)"
    return ", ".join(f"{name} {version}" for name, version in versions.items())
