"""Spaces described in JSON, as a checkpoint's ``policies.json`` and an export's description hold them.

Spaces are Box (bounds as one number when all equal, else nested lists; infinities as the
strings ``"inf"`` / ``"-inf"``), Discrete, MultiDiscrete, MultiBinary, and Tuple / Dict of
these (a Dict as ``[key, space]`` pairs, in its order). :func:`space_to_json` writes a
description, :func:`space_from_json` reads it back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from flowrl.errors import CheckpointError

_SUPPORTED_SPACES = "Box, Discrete, MultiDiscrete, MultiBinary, and Tuple or Dict (string keys) of them"
_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def space_to_json(space: gym.Space[Any], what: str = "space") -> dict[str, Any]:
    """A JSON-able description of ``space`` (see the module doc); :func:`space_from_json` inverts it.

    Raises :class:`~flowrl.errors.CheckpointError`, its message starting with ``what``, for a
    space of another kind.
    """
    kind = type(space)
    if kind is gym.spaces.Box:
        box: gym.spaces.Box = space  # type: ignore[assignment]
        return {
            "type": "Box",
            "dtype": box.dtype.name,
            "shape": list(box.shape),
            "low": _bound_to_json(box.low),
            "high": _bound_to_json(box.high),
        }
    if kind is gym.spaces.Discrete:
        discrete: gym.spaces.Discrete = space  # type: ignore[assignment]
        dtype = np.dtype(discrete.dtype).name
        return {"type": "Discrete", "n": int(discrete.n), "start": int(discrete.start), "dtype": dtype}
    if kind is gym.spaces.MultiDiscrete:
        multi: gym.spaces.MultiDiscrete = space  # type: ignore[assignment]
        dtype = np.dtype(multi.dtype).name
        return {"type": "MultiDiscrete", "nvec": multi.nvec.tolist(), "start": multi.start.tolist(), "dtype": dtype}
    if kind is gym.spaces.MultiBinary:
        n = space.n  # type: ignore[attr-defined]
        return {"type": "MultiBinary", "n": int(n) if np.ndim(n) == 0 else np.asarray(n).tolist()}
    if kind is gym.spaces.Tuple:
        parts = space.spaces  # type: ignore[attr-defined]
        return {"type": "Tuple", "spaces": [space_to_json(part, f"{what} [{i}]") for i, part in enumerate(parts)]}
    if kind is gym.spaces.Dict:
        items = space.spaces.items()  # type: ignore[attr-defined]
        for key, _ in items:
            if not isinstance(key, str):
                raise CheckpointError(f"{what} {space} has the key {key!r}: a Dict space needs string keys here")
        return {"type": "Dict", "spaces": [[key, space_to_json(part, f"{what} [{key!r}]")] for key, part in items]}
    raise CheckpointError(
        f"{what} {space} is a {kind.__name__}, which flowrl cannot describe in JSON; supported: {_SUPPORTED_SPACES}"
    )


def _bound_to_json(bound: np.ndarray) -> Any:
    # One number when every element agrees (image spaces: 0 and 255), else nested lists.
    flat = bound.reshape(-1)
    if flat.size and (flat == flat[0]).all():
        return _finite_or_name(flat[0].item())
    return _finite_or_name(bound.tolist())


def _finite_or_name(value: Any) -> Any:
    # Standard JSON has no infinity; name it so any reader can parse the file.
    if isinstance(value, list):
        return [_finite_or_name(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def space_from_json(description: Mapping[str, Any]) -> gym.Space[Any]:
    """The space :func:`space_to_json` described (``KeyError``/``TypeError``/``ValueError`` if malformed)."""
    kind = description["type"]
    if kind == "Box":
        dtype = np.dtype(description["dtype"])
        shape = tuple(int(d) for d in description["shape"])
        # The stored numbers came from arrays of this dtype, so converting back is exact.
        low, high = (
            np.broadcast_to(np.asarray(_named_to_float(description[k]), dtype=dtype), shape).copy()
            for k in ("low", "high")
        )
        return gym.spaces.Box(low=low, high=high, shape=shape, dtype=dtype)
    if kind == "Discrete":
        dtype = np.dtype(description.get("dtype", "int64"))
        # Only when needed: gymnasium 1.0's Discrete takes no dtype.
        extra: dict[str, Any] = {} if dtype == np.int64 else {"dtype": dtype.type}
        return gym.spaces.Discrete(int(description["n"]), start=int(description.get("start", 0)), **extra)
    if kind == "MultiDiscrete":
        return gym.spaces.MultiDiscrete(
            np.asarray(description["nvec"], dtype=np.int64),
            dtype=np.dtype(description.get("dtype", "int64")).type,
            start=description.get("start"),
        )
    if kind == "MultiBinary":
        n = description["n"]
        return gym.spaces.MultiBinary(int(n) if isinstance(n, int) else [int(d) for d in n])
    if kind == "Tuple":
        return gym.spaces.Tuple([space_from_json(part) for part in description["spaces"]])
    if kind == "Dict":
        return gym.spaces.Dict([(str(key), space_from_json(part)) for key, part in description["spaces"]])
    raise ValueError(f"unknown space type {kind!r}")


def _named_to_float(value: Any) -> Any:
    if isinstance(value, list):
        return [_named_to_float(v) for v in value]
    if isinstance(value, str):
        return _NON_FINITE[value]
    return value
