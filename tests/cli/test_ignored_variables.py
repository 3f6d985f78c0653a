"""An environment variable that nearly names a setting of ``waltz cluster`` or ``waltz console``
is said to be ignored, on stderr, whatever the command's log level (docs/configuration.md,
"Cluster tool (`waltz cluster ...`)" and "Operator console (`waltz console`)"): ignored, a TLS
file means plaintext, or a tool without its certificate.

ZooKeeper is a closed port: the commands load their settings, warn, then fail on it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def _waltz(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    with socket.create_server(("127.0.0.1", 0)) as closed:
        zookeeper = f"127.0.0.1:{closed.getsockname()[1]}"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WALTZ_")}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "waltz",
            *argv,
            "--zookeeper",
            zookeeper,
            "--root",
            "/waltz/x",
            "--timeout",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**clean, **env},
    )


def test_a_misspelt_cluster_variable_is_said_to_be_ignored_though_the_tool_logs_errors_only() -> None:
    done = _waltz("cluster", "verify", env={"WALTZ_CLUSTER_TLS_CA_FILE": "/etc/waltz/ca.pem"})
    assert done.returncode == 2, done.stderr
    assert (
        "the environment variable WALTZ_CLUSTER_TLS_CA_FILE is no setting of ClusterAdminConfig and is "
        "ignored; did you mean WALTZ_CLUSTER_SSL_CA_FILE?"
    ) in done.stderr
    # Said once, however many times the settings are built.
    assert done.stderr.count("WALTZ_CLUSTER_TLS_CA_FILE is no setting") == 1


def test_a_misspelt_console_variable_is_said_to_be_ignored() -> None:
    done = _waltz(
        "console",
        env={"WALTZ_CONSOLE_TLS_CERT_FILE": "/etc/waltz/console.pem", "WALTZ_LOG_LEVEL": "CRITICAL"},
    )
    assert done.returncode == 2, done.stderr
    assert (
        "the environment variable WALTZ_CONSOLE_TLS_CERT_FILE is no setting of ConsoleConfig and is "
        "ignored; did you mean WALTZ_CONSOLE_SSL_CERT_FILE?"
    ) in done.stderr
