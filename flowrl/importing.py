"""Importing a callable named by a ``"module:function"`` path, as a config can spell one.

A bottom-layer helper that needs nothing but :mod:`flowrl.errors` (no torch, no Ray), so that
config validation can check such a path without reaching up into the policy or actor layers.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from flowrl.errors import FlowRLError


def import_callable(path: str) -> Callable[..., Any]:
    """The callable at ``"module:attribute"`` (a config can name a mapping function this way)."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise FlowRLError(f"{path!r} is not a 'module:function' path")
    try:
        value: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError) as e:
        raise FlowRLError(f"cannot import {path!r}: {e}") from None
    if not callable(value):
        raise FlowRLError(f"{path!r} is a {type(value).__name__}, not a callable")
    return value
