"""``waltz up --zookeeper`` that cannot be used: a connect string that is none is refused at once
(exit 2), and a ZooKeeper that does not answer leaves no temporary work directory behind, since no
node was started and it would hold no log (docs/local-cluster.md, "waltz up")."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path


def _up(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    temporary = tmp_path / "tmp"
    temporary.mkdir(exist_ok=True)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WALTZ_")}
    return subprocess.run(
        [sys.executable, "-m", "waltz", "up", "--insecure", "--no-zookeeper-auth", *flags],
        capture_output=True,
        text=True,
        env={**clean, "TMPDIR": str(temporary)},
        timeout=120,
        check=False,
    )


def test_a_zookeeper_option_that_is_no_connect_string_is_refused_at_once(tmp_path: Path) -> None:
    for given in ("notaport", "127.0.0.1:0", "127.0.0.1:2181,nonsense"):
        done = _up(tmp_path, "--zookeeper", given)
        assert done.returncode == 2, (given, done.stderr)
        assert f"{given!r} is not a ZooKeeper connect string: host:port" in done.stderr, done.stderr
        assert "starting" not in done.stdout
        assert list((tmp_path / "tmp").iterdir()) == []


def test_a_zookeeper_that_does_not_answer_leaves_no_work_directory(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    done = _up(tmp_path, "--zookeeper", f"127.0.0.1:{port}", "--timeout", "3")
    assert done.returncode == 1, done.stderr
    assert "error: the local cluster could not start" in done.stderr
    assert "is kept" not in done.stderr, done.stderr
    assert list((tmp_path / "tmp").iterdir()) == []
