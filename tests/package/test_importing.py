"""``flowrl.importing``: ``"module:function"`` paths, and the restriction on what they may import."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest

from flowrl.errors import FlowRLError
from flowrl.importing import ImportNotAllowedError, allowed_imports, check_import_allowed, import_callable

pytestmark = pytest.mark.unit


def test_outside_a_restriction_a_path_imports_its_module() -> None:
    assert import_callable("os.path:join") is __import__("os").path.join
    with pytest.raises(FlowRLError, match="cannot import 'os:no_such'"):
        import_callable("os:no_such")


def test_a_restriction_refuses_before_importing_and_records_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "restricted_mod.py").write_text(
        "from pathlib import Path\nPath(__file__).with_suffix('.ran').touch()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with allowed_imports(["restricted"]) as restriction:  # a prefix of the name, not a package holding it
        with pytest.raises(ImportNotAllowedError, match="callbacks names the module 'restricted_mod'") as caught:
            import_callable("restricted_mod:f", key="callbacks")
        with allowed_imports() as inner:  # nested: nothing at all
            with pytest.raises(ImportNotAllowedError, match="no module is allowed"):
                check_import_allowed("os")
        check_import_allowed("restricted.sub")  # the outer restriction is back
    assert restriction.refused == [caught.value] and len(inner.refused) == 1
    assert (caught.value.module, caught.value.key) == ("restricted_mod", "callbacks")
    assert "restricted_mod" not in sys.modules and not (tmp_path / "restricted_mod.ran").exists()
    copy = pickle.loads(pickle.dumps(caught.value))
    assert (copy.module, copy.key, copy.allowed, str(copy)) == (
        "restricted_mod",
        "callbacks",
        ("restricted",),
        str(caught.value),
    )
    check_import_allowed("restricted_mod")  # the restriction ended with its block


def test_a_package_allows_itself_and_its_submodules() -> None:
    with allowed_imports(["os"]):
        assert import_callable("os.path:join") is __import__("os").path.join
        check_import_allowed("os")
        with pytest.raises(ImportNotAllowedError, match=r"only 'os' and their submodules are allowed"):
            check_import_allowed("ossaudiodev")


@pytest.mark.parametrize("name", ["", "my-pkg", "pkg:fn", "pkg..sub"])
def test_an_allowed_import_must_be_a_module_name(name: str) -> None:
    with pytest.raises(FlowRLError, match="is not a module name"):
        with allowed_imports([name]):
            pass
