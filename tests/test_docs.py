"""The documentation's examples run: every ```python block of each page, in order, in one namespace.

A page's blocks share one namespace, so a later block may use what an earlier one defined.
Ray is initialised by the ``ray_session`` fixture, so pages only mention ``ray.init()`` in a
comment. Only blocks fenced exactly as ```python are run; use another tag (```text,
```bash, ```py) for anything that must not be. To check another page, add it to ``DOC_PATHS``.
"""

from __future__ import annotations

import re
import traceback
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

# Pages whose python blocks must run, relative to the repository root.
DOC_PATHS = [
    "docs/iterators.md",
    "docs/multi-agent.md",
    "docs/concepts.md",
    "docs/writing-an-algorithm.md",
    "docs/algorithms.md",
]

# A fence opening with exactly "python", its body, and the closing fence at the same indent.
_PYTHON_BLOCK = re.compile(
    r"^(?P<indent>[ \t]*)```python[ \t]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
    re.DOTALL | re.MULTILINE,
)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """Return ``(line, code)`` for each ```python block of a Markdown ``text``.

    ``line`` is the 1-based line of the block's first code line, so errors can point into the page.
    """
    blocks = []
    for match in _PYTHON_BLOCK.finditer(text):
        first_line = text.count("\n", 0, match.start("body")) + 1
        indent = match.group("indent")
        lines = match.group("body").splitlines()
        code = "\n".join(line[len(indent):] if line.startswith(indent) else line for line in lines)
        blocks.append((first_line, code + "\n"))
    return blocks


def test_python_blocks_finds_only_python_fences() -> None:
    text = "intro\n```python\nx = 1\n```\n```text\nnot code\n```\n\n```python\ny = x + 1\n```\n"
    assert python_blocks(text) == [(3, "x = 1\n"), (10, "y = x + 1\n")]


@pytest.mark.parametrize("doc_path", DOC_PATHS)
def test_doc_examples_run(doc_path: str, ray_session: None) -> None:
    path = REPO_ROOT / doc_path
    blocks = python_blocks(path.read_text(encoding="utf-8"))
    assert blocks, f"{doc_path} has no ```python blocks to run"
    # A module name that is not importable, so cloudpickle ships functions and classes the
    # examples define to Ray actors by value rather than by reference.
    namespace: dict[str, object] = {"__name__": f"__doc_{path.stem}__"}
    try:
        for index, (line, code) in enumerate(blocks):
            # Leading newlines make tracebacks report line numbers of the Markdown file itself.
            # dont_inherit: the docs' code must not pick up this file's __future__ imports.
            compiled = compile("\n" * (line - 1) + code, str(path), "exec", dont_inherit=True)
            try:
                exec(compiled, namespace)
            except Exception as err:
                first = next((c for c in code.splitlines() if c.strip()), "")
                pytest.fail(
                    f"{doc_path}: python block {index} (starting at line {line}: {first.strip()!r}) "
                    f"failed with {type(err).__name__}: {err}\n\n{traceback.format_exc()}",
                    pytrace=False,
                )
    finally:
        # Drop the examples' iterators and actor handles so their actors exit with this test.
        namespace.clear()
