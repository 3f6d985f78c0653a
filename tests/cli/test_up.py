"""``waltz up`` with no flags: a secure cluster (mutual TLS with role certificates made for it,
ZooKeeper credentials per role), reached with the variables it prints and by nobody without them;
``--insecure --no-zookeeper-auth`` is the explicit opt-out (docs/local-cluster.md, "waltz up")."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.waltz_up import exported, waltz_up
from waltz.local.processes import wait_until
from waltz.local.zookeeper import LocalZooKeeper
from waltz.private_files import hold_directory

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
        # After the operator's exports (which keep the operator's credential), the application's
        # credential as an export to paste in an application's shell.
        said = r"in an application's shell, after the lines above: export (\S+)=(\S+)$"
        application = re.search(said, text, re.M)
        assert application is not None, text
        assert application.group(1) == "WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE", text
        assert application.group(2).endswith("client.digest"), text
        assert env["WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE"].endswith("operator.digest"), text
        as_application = check_connectivity({**env, application.group(1): application.group(2)})
        assert as_application.returncode == 0, as_application.stdout + as_application.stderr
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


def _server_pid(root: str, name: str) -> int:
    """The PID of the server process ``name`` of the cluster under ``root`` (from /proc)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # exited meanwhile
        words = [word.decode(errors="replace") for word in argv]
        if "waltz.services.server" in words and root in words and name in words:
            return int(entry.name)
    raise AssertionError(f"no process of {name} under {root}")


def test_waltz_up_on_an_external_zookeeper_says_so_and_names_an_exited_node_s_log(
    tmp_path: Path, zookeeper: LocalZooKeeper
) -> None:
    work = tmp_path / "work"
    output = tmp_path / "up.out"
    with waltz_up(tmp_path, "--zookeeper", zookeeper.connect_string, "--work-dir", str(work)) as text:
        assert f"on ZooKeeper {zookeeper.connect_string}..." in text, text
        assert "starting ZooKeeper" not in text, text
        found = re.search(r"/waltz-local/local-[0-9a-f]{8}", text)
        assert found is not None, text
        os.kill(_server_pid(found.group(), "server-0"), signal.SIGKILL)
        wait_until(lambda: "server-0 exited" in output.read_text(), timeout=30, what="the exit reported")
        assert (
            f"warning: server-0 exited; see its log {work / 'logs' / 'server-0.log'} (" in output.read_text()
        )
    said = output.read_text()
    assert "stopped the servers and the storage nodes; data and logs kept in" in said, said


def test_client_hosts_on_loopback_is_refused_naming_the_flag_to_add() -> None:
    from typer.testing import CliRunner

    from waltz.cli.main import app

    result = CliRunner().invoke(app, ["up", "--client-hosts", "2"])
    assert result.exit_code == 2, result.output
    assert "--client-hosts 2 makes hosts of namespace mode: add --network namespaces" in result.stderr
    assert "NetworkOptions" not in result.stderr and "starting" not in result.output


def test_a_work_dir_in_use_is_refused_before_the_start_line(tmp_path: Path) -> None:
    """A second ``waltz up --work-dir DIR`` on a directory a running cluster holds (its lock held
    here, as that ``waltz up`` holds it) refuses before it says it starts anything, where it first
    printed ``starting ZooKeeper, 3 storage node(s) and 2 server(s)...``, its defaults, not the
    running cluster's."""
    work = tmp_path / "work"
    work.mkdir(mode=0o700)
    held = hold_directory(work)
    assert held is not None
    try:
        done = subprocess.run(
            [sys.executable, "-m", "waltz", "up", "--work-dir", str(work)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(held)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"work directory {work} is in use by a local cluster that runs now" in done.stderr, done.stderr
    assert "starting" not in done.stdout, done.stdout
