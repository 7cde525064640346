"""Install hints work from a clone: every one in flowrl's code comes from ``install_hint``, with an extra
pyproject.toml has (the distribution is not published, so ``pip install 'flowrl-ray[...]'`` alone fails)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from flowrl.errors import install_hint

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
# pyproject.toml's [project.optional-dependencies] names (tomllib is Python 3.11+; flowrl supports 3.10).
_SECTION = (REPO / "pyproject.toml").read_text(encoding="utf-8").split("[project.optional-dependencies]")[1]
EXTRAS = set(re.findall(r"^([\w-]+) = \[", _SECTION.split("\n[")[0], flags=re.MULTILINE))
SOURCES = sorted((REPO / "flowrl").rglob("*.py"))


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def test_the_hint_installs_from_the_clone_and_names_the_distribution() -> None:
    assert install_hint("atari") == (
        "pip install -e '.[atari]' in a clone of flowrl (pip install 'flowrl-ray[atari]' once published)"
    )
    assert install_hint().startswith("pip install -e '.' in a clone of flowrl")


def test_no_install_command_is_written_out_but_the_helpers() -> None:
    written = [
        f"{path.relative_to(REPO)}:{node.lineno}"
        for path in SOURCES
        if path.name != "errors.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "pip install" in node.value
    ]
    assert written == []


def test_every_hint_names_an_extra_of_pyproject() -> None:
    extras: dict[str, str] = {}
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "install_hint" and node.args):
                continue
            argument = node.args[0]
            where = f"{path.relative_to(REPO)}:{node.lineno}"
            if isinstance(argument, ast.Constant):
                extras[where] = argument.value
            else:  # a module constant, e.g. PLOT_EXTRA
                assert isinstance(argument, ast.Name), where
                extras[where] = getattr(importlib.import_module(module_name(path)), argument.id)
    assert len(extras) >= 15, extras  # the hints of the messages and the help texts
    assert {where: extra for where, extra in extras.items() if extra not in EXTRAS} == {}
