"""Starting or joining Ray: a Ray-version mismatch on join is named, a single-machine Ray listens on
loopback only and its new token file is the owner's alone, a token file others can read is warned about."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn

import pytest
import ray

from flowrl.engine import ray_runtime
from flowrl.errors import ClusterConnectionError, RunWarning


def _mismatch(*args: Any, **kwargs: Any) -> NoReturn:
    # The message ray._private.utils.check_version_info (Ray 2.60) raises, as a RuntimeError, from
    # ray.init(address=...) when the cluster's Ray or Python version differs from this process's.
    raise RuntimeError(
        "Version mismatch: The cluster was started with:\n    Ray: 2.48.0\n    Python: 3.10.14\n"
        "This process on node 10.0.0.5 was started with:\n    Ray: 2.60.0\n    Python: 3.11.9\n"
    )


@pytest.mark.unit
def test_joining_a_cluster_of_another_ray_version_names_both(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", _mismatch)
    with pytest.raises(ClusterConnectionError) as raised:
        ray_runtime.start_ray(address="10.0.0.1:6379")
    message = str(raised.value)
    assert "'10.0.0.1:6379'" in message
    assert "Ray 2.48.0 on Python 3.10.14" in message
    assert "Ray 2.60.0 on Python 3.11.9" in message


@pytest.mark.unit
def test_other_runtime_errors_of_a_join_are_not_translated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def fails(*args: Any, **kwargs: Any) -> NoReturn:
        raise RuntimeError("something else")

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", fails)
    with pytest.raises(RuntimeError, match="something else"):
        ray_runtime.start_ray(address="10.0.0.1:6379")


@pytest.mark.unit
def test_a_token_file_others_can_read_is_warned_about_and_left_as_it_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    token = tmp_path / ".ray" / "auth_token"
    token.parent.mkdir()
    token.write_text("0" * 64)
    token.chmod(0o644)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda *args, **kwargs: None)
    with pytest.warns(RunWarning, match=r"auth_token can be read by other users \(mode 644\)"):
        assert ray_runtime.start_ray(address="10.0.0.1:6379") is True
    assert stat.S_IMODE(token.stat().st_mode) == 0o644


_LISTENERS = """
import json, os, stat, sys, time
import psutil, ray
from flowrl.engine.ray_runtime import start_ray, stop_ray

started = start_ray(num_cpus=1)
ray.get(ray.remote(lambda: 1).remote())  # a worker process up, as in a run
time.sleep(2)  # the agents Ray starts in the background have bound their ports
session = {p.pid for p in psutil.Process().children(recursive=True)} | {os.getpid()}
listening = [
    [c.laddr.ip, c.laddr.port, psutil.Process(c.pid).name()]
    for c in psutil.net_connections(kind="tcp")
    if c.status == psutil.CONN_LISTEN and c.pid in session
]
token = os.path.expanduser("~/.ray/auth_token")
mode = stat.S_IMODE(os.stat(token).st_mode) if os.path.exists(token) else None
stop_ray(started)
print("RESULT " + json.dumps({"started": started, "listening": listening, "token_mode": mode}))
"""


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_single_machine_ray_listens_on_loopback_only_and_its_new_token_is_private(tmp_path: Path) -> None:
    pytest.importorskip("psutil")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # its own Ray, token mode as default
    env["HOME"] = str(tmp_path)  # the real ~/.ray is never touched; no token there yet
    done = subprocess.run(
        [sys.executable, "-c", _LISTENERS], env=env, capture_output=True, text=True, timeout=150, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    assert result["started"] is True
    assert len(result["listening"]) >= 3  # GCS, raylet, the driver's and the worker's servers at least
    exposed = [entry for entry in result["listening"] if entry[0] not in ("127.0.0.1", "::ffff:127.0.0.1", "::1")]
    assert exposed == []
    assert result["token_mode"] == 0o600
