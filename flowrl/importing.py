"""Importing a callable named by a ``"module:function"`` path, as a config can spell one, and
restricting which modules such a path may import.

A bottom-layer helper that needs nothing but :mod:`flowrl.errors` (no torch, no Ray), so that
config validation can check such a path without reaching up into the policy or actor layers.

Importing a module runs its code. Whoever builds a config from a file it does not trust (a
checkpoint's ``policies.json``, for :func:`flowrl.load_policy`) does it inside
:func:`allowed_imports`: while that context is active (in this thread or task; it is a
:mod:`contextvars` variable), :func:`import_callable` refuses, before importing anything, every
module that is neither one of the allowed modules nor a submodule of one, raising
:class:`ImportNotAllowedError`, and the context records the refusal.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from flowrl.errors import FlowRLError


class ImportNotAllowedError(FlowRLError):
    """A ``"module:function"`` path named a module that the active :func:`allowed_imports` does not allow.

    ``module`` is the module refused and ``key`` the config key that named it (``""`` when unknown).
    """

    def __init__(self, module: str, key: str = "", allowed: tuple[str, ...] = ()) -> None:
        self.module = module
        self.key = key
        self.allowed = allowed
        where = f"{key} names" if key else "the path names"
        permitted = f"only {', '.join(map(repr, allowed))} and their submodules are" if allowed else "no module is"
        super().__init__(f"{where} the module {module!r}, which may not be imported here ({permitted} allowed)")

    def __reduce__(self) -> tuple[type[ImportNotAllowedError], tuple[str, str, tuple[str, ...]]]:
        return (type(self), (self.module, self.key, self.allowed))


@dataclass
class ImportRestriction:
    """The modules an :func:`allowed_imports` context allows, and the imports it refused (first first)."""

    allowed: tuple[str, ...]
    refused: list[ImportNotAllowedError] = field(default_factory=list)

    def allows(self, module: str) -> bool:
        """Whether ``module`` is one of the allowed modules or a submodule of one."""
        return any(module == name or module.startswith(name + ".") for name in self.allowed)


_RESTRICTION: contextvars.ContextVar[ImportRestriction | None] = contextvars.ContextVar(
    "flowrl_import_restriction", default=None
)


@contextlib.contextmanager
def allowed_imports(modules: Iterable[str] | None = None) -> Iterator[ImportRestriction]:
    """Within the block, :func:`import_callable` imports only ``modules`` and their submodules (none: nothing).

    ``"my_pkg"`` allows ``my_pkg`` and ``my_pkg.models``, not ``my_pkg_extra``. Yields the
    restriction, whose ``refused`` lists what was refused in the block (also where the refusal
    was caught and reported as a config problem). Raises :class:`~flowrl.errors.FlowRLError` for a
    name that is not a module name.
    """
    allowed = tuple(modules or ())
    for name in allowed:
        if not isinstance(name, str) or not all(part.isidentifier() for part in name.split(".")):
            raise FlowRLError(f"allowed import {name!r} is not a module name such as 'my_pkg' or 'my_pkg.models'")
    restriction = ImportRestriction(allowed)
    token = _RESTRICTION.set(restriction)
    try:
        yield restriction
    finally:
        _RESTRICTION.reset(token)


def check_import_allowed(module: str, key: str = "") -> None:
    """Raise :class:`ImportNotAllowedError` (and record it) if the active restriction does not allow ``module``.

    Outside :func:`allowed_imports` every module is allowed. ``key``: the config key naming it.
    Code that imports a module a config names by other means than :func:`import_callable` (an
    env id ``"module:EnvId"``) calls it first.
    """
    restriction = _RESTRICTION.get()
    if restriction is None or restriction.allows(module):
        return
    error = ImportNotAllowedError(module, key, restriction.allowed)
    restriction.refused.append(error)
    raise error


def import_callable(path: str, key: str = "") -> Callable[..., Any]:
    """The callable at ``"module:attribute"`` (a config can name a mapping function this way).

    ``key``: the config key the path is the value of, named if the import is refused.
    """
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise FlowRLError(f"{path!r} is not a 'module:function' path")
    check_import_allowed(module_name, key)
    try:
        value: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError) as e:
        raise FlowRLError(f"cannot import {path!r}: {e}") from None
    if not callable(value):
        raise FlowRLError(f"{path!r} is a {type(value).__name__}, not a callable")
    return value
