"""The algorithm registry: built-in algorithms listed without importing them, so that commands stay instant."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from flowrl.algorithms import algorithm_descriptions, get_algorithm, list_algorithms

pytestmark = pytest.mark.unit

HEAVY = ("torch", "ray", "gymnasium")

IMPORTED_BY = textwrap.dedent(
    """
    import io, json, sys
    from contextlib import redirect_stdout
    from flowrl.cli.main import main
    with redirect_stdout(io.StringIO()) as shown:
        status = main(["list"])
    print(json.dumps({"status": status, "listed": shown.getvalue().count("\\n"),
                      "heavy": sorted(name for name in sys.argv[1:] if name in sys.modules)}))
    """
)


@pytest.mark.integration
def test_listing_the_algorithms_imports_neither_pytorch_nor_ray_nor_gymnasium() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", IMPORTED_BY, *HEAVY], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == {"status": 0, "listed": len(list_algorithms()), "heavy": []}


def test_each_listed_description_is_the_algorithms_own() -> None:
    described = algorithm_descriptions()
    assert list(described) == list_algorithms()
    for name, description in described.items():
        assert get_algorithm(name).description == description, name
