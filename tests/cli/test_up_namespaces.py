"""``waltz up --network namespaces``: a cluster on hosts of its own, reached from a client host.

The command prints every host (name, address, namespace) and how to connect; a ``waltz`` tool run
inside the client host with ``ip netns exec`` (as the output says) reaches ZooKeeper and every
server across the bridge; SIGTERM stops every process and removes every namespace. Needs root and
iproute2; skips saying which is missing.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from waltz.local.netns import network_lab_unavailable
from waltz.local.processes import wait_until


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout


def test_up_in_namespaces_serves_a_tool_on_a_client_host_and_cleans_up(tmp_path: Path) -> None:
    reason = network_lab_unavailable()
    if reason is not None:
        pytest.skip(reason)
    output = tmp_path / "up.out"
    argv = [sys.executable, "-m", "waltz", "up", "--network", "namespaces", "--storages", "1"]
    argv += ["--servers", "1", "--partitions", "1", "--client-hosts", "1"]
    with output.open("w") as out:
        up = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(
            lambda: "ready in" in output.read_text() or up.poll() is not None,
            timeout=120,
            what="waltz up to print 'ready in'",
        )
        text = output.read_text()
        assert up.poll() is None, text
        client = re.search(r"^\s+client-0\s+(\S+)\s+(\S+)$", text, re.MULTILINE)
        exports = re.findall(r"^\s+export (WALTZ_.*)$", text, re.MULTILINE)
        assert client and exports, text
        address, namespace = client.groups()
        assert namespace in _namespaces()
        env = {**os.environ, **dict(item.split("=", 1) for line in exports for item in line.split())}
        check = subprocess.run(
            ["ip", "netns", "exec", namespace, sys.executable, "-m", "waltz", "client", "check-connectivity"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        assert check.returncode == 0, check.stdout + check.stderr
        server = re.search(r"^\s+server-0\s+(\S+):55180", text, re.MULTILINE)
        assert server is not None and server.group(1) != address, text
        assert server.group(1) in check.stdout, check.stdout
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGTERM)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait(10)
    assert up.returncode == 0, output.read_text()
    assert namespace not in _namespaces(), "waltz up left its namespaces behind"  # removed before exiting
