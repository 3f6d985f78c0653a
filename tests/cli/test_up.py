"""``waltz up`` with no flags: a secure cluster (mutual TLS with role certificates made for it,
ZooKeeper credentials per role), reached with the variables it prints and by nobody without them;
``--insecure --no-zookeeper-auth`` is the explicit opt-out (docs/local-cluster.md, "waltz up")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.waltz_up import exported, waltz_up

pytestmark = pytest.mark.security


def check_connectivity(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``waltz client check-connectivity`` (ZooKeeper, then every server) with ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WALTZ_")}
    return subprocess.run(
        [sys.executable, "-m", "waltz", "client", "check-connectivity"],
        capture_output=True,
        text=True,
        env={**clean, **env},
        timeout=120,
        check=False,
    )


def test_waltz_up_with_no_flags_is_secure_and_reached_only_with_what_it_prints(tmp_path: Path) -> None:
    with waltz_up(tmp_path) as text:
        assert "mutual TLS" in text, text
        env = exported(text)
        assert {"WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE", "WALTZ_CLIENT_TLS_CERT_FILE"} <= set(env), text
        assert {"WALTZ_CLUSTER_SSL_CERT_FILE", "WALTZ_CLUSTER_SSL_KEY_FILE"} <= set(env), text
        reached = check_connectivity(env)
        assert reached.returncode == 0, reached.stdout + reached.stderr
        where = {k: env[k] for k in ("WALTZ_ZOOKEEPER_CONNECT_STRING", "WALTZ_CLUSTER_ROOT")}
        anonymous = check_connectivity(where)  # no ZooKeeper credential, no certificate
        assert anonymous.returncode != 0, anonymous.stdout
        no_certificate = check_connectivity({**where, **{k: v for k, v in env.items() if "TLS" not in k}})
        assert no_certificate.returncode != 0, no_certificate.stdout  # the servers want a certificate


def test_waltz_up_insecure_is_plaintext_with_open_znodes(tmp_path: Path) -> None:
    with waltz_up(tmp_path, "--insecure", "--no-zookeeper-auth") as text:
        assert "mutual TLS" not in text, text
        env = exported(text)
        assert set(env) == {"WALTZ_ZOOKEEPER_CONNECT_STRING", "WALTZ_CLUSTER_ROOT"}, text
        reached = check_connectivity(env)
        assert reached.returncode == 0, reached.stdout + reached.stderr


def test_waltz_up_describes_the_partitions_spread_over_every_server(tmp_path: Path) -> None:
    """The description waits until each server owns a partition: the first server to start owns
    them all at first, and the second takes its share moments later (docs/local-cluster.md,
    "waltz up")."""
    flags = ("--storages", "3", "--servers", "2", "--partitions", "4")
    with waltz_up(tmp_path, *flags) as text:
        lines = [line.strip() for line in text.splitlines()]
        owning = [line for line in lines if line.startswith("server-") and " owns " in line]
        assert len(owning) == 2, text
