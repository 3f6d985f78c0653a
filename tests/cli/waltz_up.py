"""``waltz up`` run as a user runs it, for the tests of tests/cli: a process of its own, its output
read until it says it is ready, SIGTERM at the end (docs/local-cluster.md, "waltz up")."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from waltz.local.processes import wait_until


@contextmanager
def waltz_up(tmp_path: Path, *flags: str) -> Iterator[str]:
    """``waltz up`` with one storage node, one server and one partition, plus ``flags``; yields
    its output once it says it is ready, and stops it with SIGTERM at the end."""
    output = tmp_path / "up.out"
    argv = [sys.executable, "-m", "waltz", "up", "--storages", "1", "--servers", "1", "--partitions", "1"]
    with output.open("w") as out:
        up = subprocess.Popen([*argv, *flags], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(
            lambda: "ready in" in output.read_text() or up.poll() is not None,
            timeout=120,
            what="waltz up to print 'ready in'",
        )
        assert up.poll() is None, output.read_text()
        yield output.read_text()
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGTERM)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait(10)
    assert up.returncode == 0, output.read_text()


def exported(text: str) -> dict[str, str]:
    """Every ``WALTZ_*`` variable of the ``export`` lines ``waltz up`` printed."""
    lines = re.findall(r"^\s+export (WALTZ_.*)$", text, re.MULTILINE)
    return dict(item.split("=", 1) for line in lines for item in line.split())
