"""The mkdocs hook of flowrl's documentation site (``mkdocs.yml`` names it).

At each build it writes two reference pages from the code, so that they never go stale:
``reference/config.md`` from the typed config classes of every registered algorithm, and
``reference/cli.md`` from the ``flowrl`` command's argument parsers. It also fails the build
(a warning, which ``mkdocs build --strict`` turns into an error) when a public name of a
package that the API reference documents (its ``__all__``) or a name of the public API contract
is not shown on its reference page: mkdocstrings leaves out the names that have no docstring.

Its functions are plain Python, so ``tests/package/test_docs_site.py`` checks the pages without
building the site.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import keyword
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

REPO_ROOT = Path(__file__).resolve().parents[1]
REFERENCE_DIR = REPO_ROOT / "docs" / "reference"
CONFIG_PAGE = "reference/config.md"
CLI_PAGE = "reference/cli.md"

#: The public API contract: package (or class) -> its names a user reaches (``Class.method`` for a method).
CONTRACT: dict[str, tuple[str, ...]] = {
    "flowrl": (
        "Trainer",
        "Trainer.train",
        "Trainer.save",
        "Trainer.restore",
        "Trainer.from_checkpoint",
        "Trainer.stop",
        "load_policy",
    ),
    "flowrl.iterators": (
        "LocalIterator",
        "LocalIterator.get_metrics",
        "ParallelIterator",
        "ParallelIteratorWorker",
        "NextValueNotReady",
        "MetricsContext",
        "SharedMetrics",
        "from_items",
        "from_range",
        "from_iterators",
        "from_actors",
    ),
    "flowrl.data": (
        "SampleBatch",
        "MultiAgentBatch",
        "DEFAULT_POLICY_ID",
        "ReplayBuffer",
        "PrioritizedReplayBuffer",
        "LocalReplayBuffer",
        "LocalReplayBuffer.add_batch",
        "LocalReplayBuffer.replay",
        "LocalReplayBuffer.update_priorities",
    ),
    "flowrl.actors": (
        "RolloutWorker",
        "WorkerSet",
        "WorkerSet.local_worker",
        "WorkerSet.remote_workers",
        "WorkerSet.sync_weights",
        "WorkerSet.foreach_worker",
        "WorkerSet.stop",
        "ReplayActor",
        "LearnerThread",
    ),
    "flowrl.operators": (
        "ParallelRollouts",
        "AsyncGradients",
        "ConcatBatches",
        "SelectExperiences",
        "StandardizeFields",
        "TrainOneStep",
        "ComputeGradients",
        "ApplyGradients",
        "AverageGradients",
        "UpdateTargetNetwork",
        "StoreToReplayBuffer",
        "Replay",
        "MixInReplay",
        "Concurrently",
        "Enqueue",
        "Dequeue",
        "StandardMetricsReporting",
        "CollectMetrics",
        "OncePerTimeInterval",
        "OncePerTimestepsElapsed",
        "STEPS_SAMPLED_COUNTER",
        "STEPS_TRAINED_COUNTER",
    ),
    "flowrl.algorithms": ("get_algorithm", "list_algorithms"),
    "flowrl.policy": ("Policy", "TorchPolicy"),
    "flowrl.envs": ("FaultInjectEnv", "check_env", "register_env"),
    "flowrl.tune": ("run",),
    # What load_policy returns.
    "flowrl.serve.inference.InferencePolicy": ("compute_action", "compute_actions"),
}

_DIRECTIVE = re.compile(r"^:::\s*(?P<path>[\w.]+)\s*$", re.MULTILINE)
_ID = re.compile(r'\bid="(?P<id>flowrl[\w.]*)"')
# A Sphinx role in a docstring as Markdown renders it: ":class:<code>~flowrl.x.Y</code>".
_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|data|attr|exc|obj|const):<code>~?(?P<name>[^<]*)</code>")

log = logging.getLogger("mkdocs.hooks.flowrl")


# --- the API reference --------------------------------------------------------------------------


def api_pages() -> dict[str, str]:
    """Each package (or object) that a ``::: path`` directive of ``docs/reference/*.md`` documents -> its page."""
    pages = {}
    for path in sorted(REFERENCE_DIR.glob("*.md")):
        for match in _DIRECTIVE.finditer(path.read_text(encoding="utf-8")):
            pages[match["path"]] = f"reference/{path.name}"
    return pages


def public_names(package: str) -> list[str]:
    """The names a package's ``__all__`` exports, read from its ``__init__.py`` without importing it (none for
    a path that is not a package)."""
    init = REPO_ROOT.joinpath(*package.split("."), "__init__.py")
    if not init.is_file():
        return []
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return []


def documented_names() -> dict[str, list[str]]:
    """Each path of the API reference -> the names its page must show: its ``__all__`` and its contract names."""
    return {
        package: list(dict.fromkeys([*public_names(package), *CONTRACT.get(package, ())])) for package in api_pages()
    }


# --- the config reference -----------------------------------------------------------------------


@dataclasses.dataclass
class _Key:
    """One config key across the algorithms that take it."""

    name: str
    algorithms: list[str] = dataclasses.field(default_factory=list)
    # (type, valid values, doc, per policy) -> algorithms; more than one when configs declare the key differently
    variants: dict[tuple[str, str, str, bool], list[str]] = dataclasses.field(default_factory=dict)
    defaults: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # shown default -> algorithms


def _shown(value: Any) -> str:
    """A default as the reference shows it: functions and classes as their ``module:name`` path."""
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{value.__module__}:{value.__qualname__}"
    return repr(value)


def _code(text: str) -> str:
    fence = "``" if "`" in text else "`"
    return f"{fence}{text}{fence}"


def _markdown_text(doc: str) -> str:
    """A config key's doc in Markdown: ``<`` would open HTML, ``*`` emphasis."""
    return doc.replace("<", "&lt;").replace("*", r"\*")


def _rllib_names() -> dict[str, list[str]]:
    """flowrl key -> RLlib's names for it (renamed, counted per learner, nested in a dict, or a Python keyword)."""
    from flowrl.config.rllib import NESTED, PER_LEARNER, RENAMED

    names: dict[str, list[str]] = {}
    for rllib_name, key in [*RENAMED.items(), *PER_LEARNER.items()]:
        names.setdefault(key, []).append(rllib_name)
    for parent, keys in NESTED.items():
        for sub_key, key in keys.items():
            names.setdefault(key, []).append(f"{parent}.{sub_key}")
    return names


def config_keys() -> tuple[dict[str, type], dict[str, _Key]]:
    """The registered algorithms' config classes, and every key with the algorithms taking it."""
    from flowrl.algorithms import get_algorithm, list_algorithms

    # The rows of TrainerConfig.describe(): a key's type, default, valid values and doc.
    from flowrl.config.fields import _specs, _type_name, _valid_values

    classes = {name: get_algorithm(name).config_class for name in list_algorithms()}
    keys: dict[str, _Key] = {}
    for algo, cls in classes.items():
        for spec in _specs(cls):
            key = keys.setdefault(spec.name, _Key(spec.name))
            key.algorithms.append(algo)
            variant = (_type_name(spec), _valid_values(spec), spec.meta.doc, spec.meta.per_policy)
            key.variants.setdefault(variant, []).append(algo)
            key.defaults.setdefault(_shown(spec.default), []).append(algo)
    return classes, keys


def _key_section(key: _Key, keys: dict[str, _Key], every: list[str], rllib: dict[str, list[str]]) -> list[str]:
    from flowrl.config.rllib import PER_LEARNER
    from flowrl.policy.model_options import DEFAULT_MODEL_CONFIG

    lines = [f"### `{key.name}` {{#{key.name}}}", ""]
    taking = "every algorithm" if key.algorithms == every else ", ".join(key.algorithms)
    lines.append(f"- **Algorithms:** {taking}")
    if len(key.defaults) == 1:
        [shown] = [_code(value) for value in key.defaults]
    else:
        defaults = sorted(key.defaults.items(), key=lambda item: -len(item[1]))
        shown = "; ".join(f"{_code(value)} ({', '.join(algos)})" for value, algos in defaults)
    lines.append(f"- **Default:** {shown}")
    spellings = [_code(name) for name in rllib.get(key.name, [])]
    for i, name in enumerate(rllib.get(key.name, [])):
        # RLlib's name is read as this key only where the algorithm has no key of that name itself.
        own = [algo for algo in keys[name].algorithms if algo in key.algorithms] if name in keys else []
        if own:
            spellings[i] += f" (not in {', '.join(own)}, where it is a key of its own)"
        if name in PER_LEARNER:
            spellings[i] += " (counted per learner: this key is RLlib's times `max(1, num_learners)`)"
    if key.name.endswith("_") and keyword.iskeyword(key.name[:-1]):
        spellings.insert(0, _code(key.name[:-1]))  # configs spell a Python keyword as RLlib does
    if spellings:
        lines.append(f"- **RLlib name:** {', '.join(spellings)}")
    if key.name == "model":
        options = ", ".join(f"`{name}` ({_code(_shown(value))})" for name, value in DEFAULT_MODEL_CONFIG.items())
        lines.append(f"- **Options and their defaults:** {options}")
    for (type_name, valid, doc, per_policy), algos in key.variants.items():
        lines.append("")
        if len(key.variants) > 1:
            lines += [f"*In {', '.join(algos)}:*", ""]
        facts = [f"Type {_code(type_name)}"] + ([f"valid: {_code(valid)}"] if valid else [])
        if per_policy:
            facts.append("a multi-agent config may set it per policy")
        lines += [f"{'; '.join(facts)}.", "", _markdown_text(doc)]
    lines.append("")
    return lines


def config_reference() -> str:
    """The Markdown of ``reference/config.md``: every key of every algorithm's config."""
    from flowrl.config import TrainerConfig

    classes, keys = config_keys()
    every = list(classes)
    rllib = _rllib_names()
    shared = [f.name for f in dataclasses.fields(TrainerConfig)]
    lines = [
        "# Config keys",
        "",
        "Every key of every algorithm's config, generated from the typed config classes when the site",
        "is built: its type and valid values, its default (per algorithm where an algorithm changes it),",
        "which algorithms take it, RLlib's name for it where RLlib spells it otherwise, and what it means.",
        "Set keys in `Trainer(config={...})`, in a config file's `config:` mapping, or with",
        "`flowrl train --set key=value` (see [the flowrl command](../cli.md#config-precedence)); an",
        "unknown key or an invalid value is reported before any actor starts. In Python,",
        "`get_algorithm(name).config_class.describe()` prints the same table for one algorithm, and",
        "[Coming from RLlib](../coming-from-rllib.md) says how each RLlib key is read.",
        "",
        "## Algorithms",
        "",
        "| algorithm | config class | keys | its own keys |",
        "|---|---|---|---|",
    ]
    for algo, cls in classes.items():
        own = [f"[`{k.name}`](#{k.name})" for k in keys.values() if algo in k.algorithms and k.name not in shared]
        lines.append(
            f"| `{algo}` | `{cls.__module__}.{cls.__qualname__}` | {len(dataclasses.fields(cls))} | {', '.join(own)} |"
        )
    lines += ["", "## Keys every algorithm takes", ""]
    for name in shared:
        lines += _key_section(keys[name], keys, every, rllib)
    lines += ["## Keys of some algorithms", ""]
    for name in sorted(set(keys) - set(shared)):
        lines += _key_section(keys[name], keys, every, rllib)
    return "\n".join(lines)


# --- the CLI reference --------------------------------------------------------------------------


@contextlib.contextmanager
def _help_width(columns: int) -> Iterator[None]:
    """argparse wraps help to the terminal's width, read from ``COLUMNS``: the same text on every machine."""
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(columns)
    try:
        yield
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parsers of ``parser``'s subcommands, by name, in the order ``--help`` lists them."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def cli_reference() -> str:
    """The Markdown of ``reference/cli.md``: the help of ``flowrl`` and of each subcommand."""
    from flowrl.cli.main import build_parser

    parser = build_parser()
    lines = [
        "# Command line",
        "",
        "The help of the `flowrl` command and of each subcommand, generated from its parsers when the",
        "site is built. [The flowrl command](../cli.md) shows them at work.",
        "",
    ]
    with _help_width(80):
        lines += ["## `flowrl`", "", "```text", parser.format_help().rstrip(), "```", ""]
        for name, command in subcommands(parser).items():
            lines += [f"## `flowrl {name}`", "", "```text", command.format_help().rstrip(), "```", ""]
    return "\n".join(lines)


# --- mkdocs events ------------------------------------------------------------------------------

_rendered_ids: dict[str, set[str]] = {}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the generated reference pages."""
    for uri, content in ((CONFIG_PAGE, config_reference()), (CLI_PAGE, cli_reference())):
        files.append(File.generated(config, uri, content=content))
    return files


def on_pre_build(config: MkDocsConfig) -> None:
    """Warn (an error under ``--strict``) about a contract package without a reference page."""
    _rendered_ids.clear()
    pages = api_pages()
    for package in CONTRACT:
        if package not in pages:
            log.warning(f"{package} (public API contract) has no `::: {package}` directive in docs/reference/")


def on_page_content(html: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Record the objects an API reference page shows (mkdocstrings gives each heading its dotted path as id),
    and drop the Sphinx roles of its docstrings (``:class:`~flowrl.x.Y``` shows as ``flowrl.x.Y``)."""
    if page.file.src_uri.startswith("reference/"):
        _rendered_ids[page.file.src_uri] = {match["id"] for match in _ID.finditer(html)}
        html = _ROLE.sub(r"<code>\g<name></code>", html)
    return html


def on_post_build(config: MkDocsConfig) -> None:
    """Warn about a public name that its reference page does not show (mkdocstrings leaves out undocumented ones)."""
    pages = api_pages()
    for package, names in documented_names().items():
        shown = _rendered_ids.get(pages[package], set())
        for name in names:
            if f"{package}.{name}" not in shown:
                log.warning(
                    f"{pages[package]} does not show {package}.{name}: it has no docstring (for a constant, "
                    "a `#:` comment above it) or does not exist"
                )
