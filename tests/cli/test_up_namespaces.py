"""``waltz up --network namespaces``: a cluster on hosts of its own, reached from a client host.

The command prints every host (name, address, namespace) and how to connect; a ``waltz`` tool run
inside the client host with ``ip netns exec`` (as the output says) reaches ZooKeeper and every
server across the bridge; SIGTERM stops every process and removes every namespace. Needs root and
iproute2; skips saying which is missing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.waltz_up import exported, waltz_up
from waltz.local.netns import network_lab_unavailable


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout


def test_up_in_namespaces_serves_a_tool_on_a_client_host_and_cleans_up(tmp_path: Path) -> None:
    reason = network_lab_unavailable()
    if reason is not None:
        pytest.skip(reason)
    flags = ["--network", "namespaces", "--client-hosts", "1"]
    with waltz_up(tmp_path, *flags) as text:
        client = re.search(r"^\s+client-0\s+(\S+)\s+(\S+)$", text, re.MULTILINE)
        env = exported(text)
        assert client and env, text
        address, namespace = client.groups()
        assert namespace in _namespaces()
        check = subprocess.run(
            ["ip", "netns", "exec", namespace, sys.executable, "-m", "waltz", "client", "check-connectivity"],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            timeout=120,
            check=False,
        )
        assert check.returncode == 0, check.stdout + check.stderr
        server = re.search(r"^\s+server-0\s+(\S+):55180", text, re.MULTILINE)
        assert server is not None and server.group(1) != address, text
        assert server.group(1) in check.stdout, check.stdout
    assert namespace not in _namespaces(), "waltz up left its namespaces behind"  # removed before exiting
