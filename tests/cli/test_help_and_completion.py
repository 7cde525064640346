"""``flowrl --version``, the examples in ``train --help`` and ``tune --help``, and shell completion."""

from __future__ import annotations

import functools
import importlib.metadata
import shlex
import sys
from pathlib import Path

import argcomplete
import pytest

from flowrl._version import __version__
from flowrl.cli import main as cli

pytestmark = pytest.mark.unit


def test_version_names_flowrl_ray_and_torch(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"flowrl {__version__} (")
    assert f"Ray {importlib.metadata.version('ray')}" in printed
    assert f"PyTorch {importlib.metadata.version('torch')}" in printed


@pytest.mark.parametrize("command", ["train", "tune"])
def test_help_ends_with_examples_that_parse(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    examples = capsys.readouterr().out.split("\nexamples:\n")[1].splitlines()
    assert len(examples) >= 3
    for line in examples:
        argv = shlex.split(line, comments=True)
        assert argv[0] == "flowrl"
        args = cli.build_parser().parse_args(argv[1:])  # a flag that does not exist fails here
        assert args.command == argv[1]


def completions(line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What ``flowrl`` offers the shell for ``line`` (argcomplete's protocol: environment in, words out)."""
    out = tmp_path / "completions"
    monkeypatch.setenv("_ARGCOMPLETE", "1")
    monkeypatch.setenv("_ARGCOMPLETE_IFS", "\n")
    monkeypatch.setenv("_ARGCOMPLETE_STDOUT_FILENAME", str(out))
    monkeypatch.setenv("COMP_LINE", line)
    monkeypatch.setenv("COMP_POINT", str(len(line)))
    # argcomplete ends the process with os._exit once it has answered: here, SystemExit; and it would
    # write its debug output to file descriptor 9, which in pytest is another file's.
    monkeypatch.setattr(argcomplete, "autocomplete", functools.partial(argcomplete.autocomplete, exit_method=sys.exit))
    monkeypatch.setattr(argcomplete.CompletionFinder, "_init_debug_stream", lambda self: None)
    with pytest.raises(SystemExit):
        cli.main([])
    return out.read_text().split()


def test_the_shell_completes_commands_and_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert sorted(completions("flowrl t", tmp_path, monkeypatch)) == ["trace", "train", "tune"]
    assert "--stop-timesteps" in completions("flowrl train --stop-t", tmp_path, monkeypatch)
    assert completions("flowrl plan --form", tmp_path, monkeypatch) == ["--format"]


def test_without_argcomplete_flowrl_runs_as_before(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "argcomplete", None)  # import argcomplete raises ImportError
    monkeypatch.setenv("_ARGCOMPLETE", "1")
    assert cli.main(["list"]) == 0
    assert "ppo" in capsys.readouterr().out
