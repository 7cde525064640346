"""PyTorch and Ray imported on first use, so that what never touches them never pays for them.

``from flowrl.deferred import torch`` binds a module object that imports PyTorch the first time
one of its attributes is read, then serves every later read from the real module's namespace
as fast as the real module does: code keeps writing ``torch.as_tensor(...)``, and a module that
only defines functions and classes using torch (a loss, a policy class) imports in
microseconds. ``flowrl plan`` builds a plan's graph this way without loading PyTorch or Ray
(0.4 s; 1.8 to 2.6 s when they were imported up front), while a training run loads both as
soon as it builds a policy or starts Ray, as before.

Type checkers see the real modules. What reads an attribute at import time (``class M(nn.Module)``,
``@ray.remote`` on a module-level class) loads the module then, as a plain import would.
"""

from __future__ import annotations

import functools
import importlib
import sys
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

__all__ = ["F", "DeferredModule", "deferred_attributes", "dist", "nn", "ray", "torch"]


class DeferredModule(types.ModuleType):
    """A stand-in for module ``name`` that imports it when an attribute is first read.

    On that read every flowrl module holding the stand-in gets the real module in its place, so
    later reads there are plain module reads (and see what a test patches on the real module).
    The stand-in itself takes the real module's namespace and becomes a plain module object for
    any other holder, looking up there the names the real module gains later (a PEP 562 module
    ``__getattr__``).
    """

    def __getattr__(self, attribute: str) -> Any:
        module = importlib.import_module(self.__name__)
        for holder in [m for name, m in list(sys.modules.items()) if name == "flowrl" or name.startswith("flowrl.")]:
            for key in [key for key, value in vars(holder).items() if value is self]:
                setattr(holder, key, module)
        self.__dict__.update(vars(module))
        self.__dict__["__getattr__"] = functools.partial(getattr, module)
        self.__class__ = types.ModuleType  # type: ignore[assignment]  # modules may change __class__ (Python 3.5+)
        return getattr(module, attribute)

    def __repr__(self) -> str:
        return f"<deferred module {self.__name__!r} (not imported yet)>"

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return importlib.import_module, (self.__name__,)


if TYPE_CHECKING:
    import ray as ray
    import torch as torch
    import torch.distributed as dist
    import torch.nn.functional as F  # noqa: N812 (PyTorch's usual name)
    from torch import nn as nn
else:
    torch = DeferredModule("torch")
    nn = DeferredModule("torch.nn")
    F = DeferredModule("torch.nn.functional")
    dist = DeferredModule("torch.distributed")
    ray = DeferredModule("ray")


def deferred_attributes(package: str, modules: dict[str, list[str]]) -> Callable[[str], Any]:
    """A package's module ``__getattr__`` (PEP 562) that imports ``modules[m]``'s names from module ``m`` on first use.

    A package that re-exports its modules' names this way costs nothing to import: ``from
    flowrl.actors import WorkerSet`` imports the worker set's module alone. Each name found is
    stored in the package, so the lookup runs once per name.
    """
    where = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
