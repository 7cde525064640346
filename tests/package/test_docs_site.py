"""The documentation site's generated references cover the code: every config key of every algorithm,
every ``flowrl`` subcommand and flag, every name of the public API contract with its docstring.

``docs/hooks.py`` (the mkdocs hook that writes the config and CLI references at build time) is
imported from its file, so these checks run without building the site; CI builds it too
(``mkdocs build --strict`` in ``.ci/run``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import griffe
import pytest

from flowrl.algorithms import get_algorithm, list_algorithms

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[2]


def _load_hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("flowrl_docs_hooks", REPO_ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


hooks = _load_hooks()


def key_sections(text: str) -> dict[str, str]:
    """``### `key` {#key}`` sections of the config reference: key -> the section's text."""
    parts = re.split(r"^### `(\w+)` \{#\w+\}$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


def algorithms_line(section: str) -> str:
    [line] = [line for line in section.splitlines() if line.startswith("- **Algorithms:** ")]
    return line.removeprefix("- **Algorithms:** ")


def test_config_reference_lists_every_key_of_every_algorithm() -> None:
    sections = key_sections(hooks.config_reference())
    algorithms = list_algorithms()
    declared: dict[str, set[str]] = {}
    for algo in algorithms:
        for f in dataclasses.fields(get_algorithm(algo).config_class):
            declared.setdefault(f.name, set()).add(algo)
    assert set(sections) == set(declared)
    for key, algos in declared.items():
        taking = algorithms_line(sections[key])
        shown = set(algorithms) if taking == "every algorithm" else set(taking.split(", "))
        assert shown == algos, key


def test_config_reference_shows_types_defaults_per_algorithm_docs_and_rllib_names() -> None:
    sections = key_sections(hooks.config_reference())
    lr = sections["lr"]
    assert "`0.0003` (cql, ppo, sac)" in lr and "`0.004` (pg)" in lr  # PPO's and SAC's (CQL takes SAC's), PG's own
    assert "Type `float`; valid: `> 0`" in lr
    assert "Learning rate of the policy's optimizer" in lr
    # RLlib's name, except in ARS, which has a key of that name.
    assert "`sgd_stepsize` (not in ars, where it is a key of its own)" in lr
    assert "- **RLlib name:** `lambda`" in sections["lambda_"]
    assert "`replay_buffer_config.capacity`" in sections["buffer_size"]
    # RLlib's new API stack's keys counted per learner.
    assert "`train_batch_size_per_learner` (counted per learner" in sections["train_batch_size"]
    assert "`minibatch_size` (counted per learner" in sections["sgd_minibatch_size"]
    # A function default is shown as its import path, never as a repr with a memory address.
    assert "`flowrl.algorithms.ppo_dqn:even_ppo_odd_dqn` (ppo_dqn)" in sections["policy_mapping_fn"]
    # Keys that configs declare differently show each declaration with the algorithms using it.
    assert "*In a3c:*" in sections["num_workers"]


def test_cli_reference_shows_every_subcommand_and_flag() -> None:
    from flowrl.cli.main import build_parser

    text = hooks.cli_reference()
    commands = hooks.subcommands(build_parser())
    assert {"train", "tune", "evaluate", "export", "plan"} <= set(commands)
    for name, parser in commands.items():
        section = text.split(f"## `flowrl {name}`\n", 1)[1].split("\n## ", 1)[0]
        for action in parser._actions:
            for flag in action.option_strings:
                assert flag in section, (name, flag)


def _contract_names() -> list[tuple[str, str]]:
    return [(package, name) for package, names in hooks.CONTRACT.items() for name in names]


@pytest.fixture(scope="module")
def packages() -> dict[str, Any]:
    """The API reference's packages as griffe (mkdocstrings' reader) sees them, ``#:`` comments included."""
    loader = griffe.GriffeLoader(search_paths=[str(REPO_ROOT)], extensions=griffe.load_extensions("griffe_sphinx"))
    loader.load("flowrl")  # with every subpackage: loading each again would read the whole tree again
    loader.resolve_aliases(external=False, implicit=False)
    return {path: loader.modules_collection[path] for path in hooks.api_pages()}


def test_api_reference_pages_name_every_contract_name(packages: dict[str, Any]) -> None:
    pages = hooks.api_pages()
    names = hooks.documented_names()
    for package, name in _contract_names():
        assert package in pages, f"no docs/reference page has `::: {package}`"
        # A package's page renders its public names: a contract class's name heads its members.
        if hooks.public_names(package):
            assert name.split(".")[0] in hooks.public_names(package), f"{package}.{name} is not in {package}.__all__"
        assert name in names[package]


def test_every_public_name_of_the_api_reference_has_a_docstring(packages: dict[str, Any]) -> None:
    problems = []
    for package, names in hooks.documented_names().items():
        for name in names:
            docstring = packages[package][name].docstring
            if docstring is None or not docstring.value.strip():
                problems.append(f"{package}.{name}")
    assert problems == []


def test_docs_home_page_shows_the_readme_quick_start() -> None:
    def bash_blocks(path: Path) -> list[str]:
        return re.findall(r"^```bash\n(.*?)^```", path.read_text(encoding="utf-8"), re.DOTALL | re.MULTILINE)

    assert bash_blocks(REPO_ROOT / "docs" / "index.md") == bash_blocks(REPO_ROOT / "README.md")[:2]
