"""Deferred imports (flowrl.deferred): a module imported when first read, and packages whose names load on use."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowrl.deferred import DeferredModule, deferred_attributes

pytestmark = pytest.mark.unit


@pytest.fixture
def probe_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The name of a module on the path that no one has imported yet."""
    name = f"flowrl_deferred_probe_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text("IMPORTS = 1\nVALUE = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_a_deferred_module_imports_on_the_first_attribute_read(probe_module: str) -> None:
    deferred = DeferredModule(probe_module)
    assert probe_module not in sys.modules
    assert repr(deferred) == f"<deferred module {probe_module!r} (not imported yet)>"
    assert deferred.VALUE == 3
    real = sys.modules[probe_module]
    assert type(deferred) is types.ModuleType and deferred.__file__ == real.__file__  # a plain module from now on
    real.LATER = "set after the import"  # a name the module gains later is found too
    assert deferred.LATER == "set after the import" and deferred.IMPORTS == 1
    with pytest.raises(AttributeError, match="MISSING"):
        _ = deferred.MISSING


def test_flowrl_modules_holding_a_deferred_module_get_the_real_one(
    probe_module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """So that they read the real module's attributes, patched ones included, at a plain module's speed."""
    holder = types.ModuleType("flowrl.deferred_probe_holder")
    deferred = holder.probe = holder.alias = DeferredModule(probe_module)
    monkeypatch.setitem(sys.modules, holder.__name__, holder)
    assert deferred.VALUE == 3
    real = sys.modules[probe_module]
    assert holder.probe is real and holder.alias is real
    monkeypatch.setattr(real, "VALUE", 4)
    assert holder.probe.VALUE == 4


def test_a_deferred_module_pickles_as_the_module(probe_module: str) -> None:
    assert pickle.loads(pickle.dumps(DeferredModule(probe_module))) is sys.modules[probe_module]


def test_a_deferred_module_that_does_not_exist_raises_on_use() -> None:
    deferred = DeferredModule("flowrl_no_such_module")
    with pytest.raises(ModuleNotFoundError, match="flowrl_no_such_module"):
        _ = deferred.anything


def test_a_package_loads_a_name_from_its_module_on_first_use(
    probe_module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = types.ModuleType("flowrl_deferred_package")
    monkeypatch.setitem(sys.modules, package.__name__, package)
    lookup = deferred_attributes(package.__name__, {probe_module: ["VALUE"]})
    assert probe_module not in sys.modules
    assert lookup("VALUE") == 3 and package.VALUE == 3  # stored in the package: looked up once
    with pytest.raises(AttributeError, match="module 'flowrl_deferred_package' has no attribute 'IMPORTS'"):
        lookup("IMPORTS")


IMPORTS_OF_A_DECLARATION = textwrap.dedent(
    """
    import sys
    import flowrl.actors, flowrl.operators, flowrl.policy, flowrl.engine.trainer
    from flowrl.actors import WorkerSet
    from flowrl.algorithms.apex import ALGORITHM
    try:
        from flowrl.actors import NoSuchName
    except ImportError as e:
        print("ERROR", e)
    print("LOADED", sorted({"torch", "ray"} & set(sys.modules)))
    """
)


@pytest.mark.integration
def test_the_packages_and_the_trainer_import_neither_pytorch_nor_ray() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", IMPORTS_OF_A_DECLARATION], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ERROR cannot import name 'NoSuchName' from 'flowrl.actors'" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "LOADED []"
