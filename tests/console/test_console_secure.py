"""The console against a secure local cluster, run as `waltz up` suggests: the `operator`
certificate and the operators' ZooKeeper credential (docs/console.md "Starting it", "Operator
actions", "Exit codes"; docs/design/console.md "Cluster map", "Serving").

One secure cluster (mutual TLS with role certificates, ZooKeeper credentials per role; 2 replicas
of each partition on 3 storage nodes) and one ``waltz console --operator`` on loopback serve the
module; some tests start consoles of their own, real processes stopped with real signals, against
/metrics endpoints served on 127.0.0.1 by the test (slow, flooding), and one drives the page in
headless chromium (the module's ``chromium``).
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import support
from kazoo.security import OPEN_ACL_UNSAFE

from tests.console.console_helpers import RunningConsole, act_and_read, launch_console, request
from waltz.admin.cluster_admin import ClusterAdmin
from waltz.admin.config import ClusterAdminConfig
from waltz.admin.verify import CheckStatus
from waltz.local.cluster import LocalCluster
from waltz.local.options import ProcessOptions
from waltz.local.processes import wait_until
from waltz.metadata.replicas import ReplicaChangeRefusedError

pytest.importorskip("starlette", reason="the console extra is not installed")

pytestmark = pytest.mark.security


@pytest.fixture(scope="module")
def secure_cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: object) -> Iterator[LocalCluster]:
    """3 storage nodes, 2 servers, 2 partitions of 2 replicas each, every node serving /metrics."""
    with LocalCluster(
        storages=3,
        servers=2,
        partitions=2,
        replicas=2,
        processes=ProcessOptions(metrics=True),
        name="console-secure",
        zookeeper=zookeeper.connect_string,  # type: ignore[attr-defined]
        work_dir=tmp_path_factory.mktemp("console-secure-cluster"),
        delete_root=True,
    ) as cluster:
        yield cluster


def operator_env(cluster: LocalCluster) -> dict[str, str]:
    """The environment `waltz up` tells an operator to export: the `operator` certificate."""
    return {**os.environ, **cluster.admin_env("operator")}


def connect(cluster: LocalCluster, certificate: str, *, check_acls: bool = True) -> ClusterAdmin:
    """A cluster admin presenting ``certificate`` with the operators' ZooKeeper credential."""
    config = ClusterAdminConfig(**cluster.admin_settings(certificate))
    return ClusterAdmin.connect(
        cluster.zookeeper_connect_string,
        cluster.root,
        tls=config.tls(),
        security=config.zookeeper_security(),
        check_acls=check_acls,
    )


@pytest.fixture(scope="module")
def consoles(
    secure_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, RunningConsole]]:
    logs = tmp_path_factory.mktemp("secure-consoles")
    console = launch_console(
        logs,
        secure_cluster,
        "--operator",
        name="console-operator-certificate",
        env=operator_env(secure_cluster),
    )
    try:
        console.wait_ready()
        yield {"operator": console}
    finally:
        console.close()


@pytest.fixture
def cluster(
    request: pytest.FixtureRequest, secure_cluster: LocalCluster, consoles: dict[str, RunningConsole]
) -> LocalCluster:
    for name, console in consoles.items():
        support.add_failure_logs(request.node, f"{name} console log", console.process.log_tail)
    return support.healed_cluster(request, secure_cluster)


def problems(console: RunningConsole) -> set[tuple[str, str]]:
    found = console.get_json("/api/map.json")["map"]["problems"]
    return {(p["name"], p["status"]) for p in found}


def test_the_problems_are_every_check_of_verify_with_the_acls(
    cluster: LocalCluster, consoles: dict[str, RunningConsole]
) -> None:
    console = consoles["operator"]
    squatter = f"{cluster.root}/squatter"
    with connect(cluster, "operator", check_acls=False) as admin:
        admin.cluster.zk.create(squatter, b"", acl=OPEN_ACL_UNSAFE)
        try:
            verified = admin.verify()
            failed = {(c.name, c.status.value) for c in verified.checks if c.status is not CheckStatus.PASSED}
            assert ("zookeeper: root and children ACLs", "FAILED") in failed, verified
            # The console reports what the command reports, the open znode included.
            wait_until(
                lambda: problems(console) == failed,
                timeout=30,
                what=f"the console's problems to be verify's {sorted(failed)}",
                interval=0.2,
            )
            status, page = request(console.url + "fragments/map")
            assert status == 200 and "squatter" in page and "Every check" not in page, page
        finally:
            admin.cluster.zk.delete(squatter)
    wait_until(
        lambda: ("zookeeper: root and children ACLs", "FAILED") not in problems(console),
        timeout=30,
        what="the ACL problem to go once the znode is deleted",
        interval=0.2,
    )


def test_the_servers_are_shown_by_their_names(
    cluster: LocalCluster, consoles: dict[str, RunningConsole]
) -> None:
    console = consoles["operator"]
    names = {f"server-{i}" for i in range(len(cluster.servers))}
    found = console.get_json("/api/map.json")["map"]
    assert {s["name"] for s in found["servers"]} == names, found["servers"]
    assert {s["server_name"] for s in found["servers"]} == names
    assert all(s["member"].startswith("member-") for s in found["servers"])
    assert {p["owner_name"] for p in found["partitions"]} <= names
    status, page = request(console.url + "fragments/map")
    assert status == 200
    for name in names:
        assert re.search(rf'<tr class="server [^"]*"[^>]* data-name="{name}"', page), page
        assert re.search(rf'<td class="name">{name} <span class="detail">member-\d+</span>', page), page


def assigned(cluster: LocalCluster, partition_id: int) -> list[str]:
    with connect(cluster, "operator") as admin:
        return admin.cluster.assignments().value.storages_of(partition_id)


def test_a_removal_without_the_admin_role_is_not_done_and_a_safety_rule_refusal_offers_no_force(
    cluster: LocalCluster, consoles: dict[str, RunningConsole]
) -> None:
    console = consoles["operator"]
    token = {"X-Console-Token": console.token()}
    first, second = assigned(cluster, 0)
    remove = f"kind=remove-replica&partition=0&storage={second}"

    def removed() -> str | None:
        statuses, text = act_and_read(console, remove, headers=token)
        assert statuses in ([200, 409], [200, 502]), (statuses, text)
        return text if statuses == [200, 502] else None  # 409: the safety rules want a caught-up replica

    try:
        # The console's operator certificate lacks the admin role: refused before ZooKeeper
        # changes (where ZooKeeper changed and then the node refused), so not done, and nothing
        # to finish.
        text = wait_until(
            removed, timeout=60, what="the removal to run", interval=0.5, abort_on=(AssertionError,)
        )
        assert "Not done" in text and "Done:" not in text, text
        assert "urn:waltz:role:admin" in text and "Nothing was written" in text, text
        assert "when the node is back" not in text and "PERMISSION_DENIED" not in text, text
        assert second in assigned(cluster, 0)
        command = re.escape(f"waltz cluster storage unassign {second} --partition 0")
        wait_until(
            lambda: re.search(
                rf"WARNING waltz\.console\.audit .*{command} by .* failed: .*urn:waltz:role:admin",
                console.log(),
            ),
            timeout=10,
            what="the failure's audit line",
            interval=0.1,
        )
        assert not re.search(rf"{command} by .* done:", console.log()), console.log()

        # The last replica: the safety rule refuses, and the console says what it can do.
        with connect(cluster, "admin") as admin:
            wait_until(
                lambda: _unassigned(admin, second), timeout=60, what=f"{second} to give up partition 0"
            )
        statuses, text = act_and_read(
            console, f"kind=remove-replica&partition=0&storage={first}", headers=token
        )
        assert statuses == [200, 409], (statuses, text)
        assert "only replica" in text and "--force" not in text and "never overrides" in text, text
        last = re.escape(f"waltz cluster storage unassign {first} --partition 0")
        wait_until(
            lambda: re.search(
                rf"WARNING waltz\.console\.audit .*{last} by .* refused: .*only replica", console.log()
            ),
            timeout=10,
            what="the refusal's audit line",
            interval=0.1,
        )
        assert not re.search(rf"INFO waltz\.console\.audit .*{last} by .* failed", console.log())
    finally:
        with connect(cluster, "admin") as admin:

            def restored() -> bool:
                try:
                    admin.storage.assign(second, [0])
                except ReplicaChangeRefusedError:
                    return False
                return True

            wait_until(restored, timeout=60, what=f"{second} to hold partition 0 again", interval=0.5)


def _unassigned(admin: ClusterAdmin, storage: str) -> bool:
    """Unassign ``storage``'s replica of partition 0; False while the safety rules refuse it."""
    try:
        admin.storage.unassign(storage, [0])
    except ReplicaChangeRefusedError:
        return False
    return True


def test_sigterm_stops_the_console_with_exit_code_0(cluster: LocalCluster, tmp_path: Path) -> None:
    console = launch_console(tmp_path, cluster, name="console-sigterm", env=operator_env(cluster))
    try:
        console.wait_ready()
    finally:
        code = console.process.terminate(timeout=15)
    assert code == 0, console.log()
    assert "Traceback" not in console.log()


def test_a_tls_key_that_is_not_pem_ends_the_start_with_exit_code_2(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """The cluster's TLS files are checked before anything is contacted (docs/operations.md,
    "Certificates"): the key that is not PEM is named with its setting, a configuration error."""
    not_pem = tmp_path / "operator-key.pem"
    not_pem.write_text("this is not a PEM key\n")
    env = {**operator_env(cluster), "WALTZ_CLUSTER_SSL_KEY_FILE": str(not_pem)}
    console = launch_console(tmp_path, cluster, name="console-bad-key", env=env)
    try:
        code = console.process.wait(60)
    finally:
        console.close()
    log = console.log()
    assert code == 2, log
    assert f"cluster.ssl.keyFile {not_pem} cannot be used together" in log, log
    assert "Traceback" not in log and "waltz console of" not in log, log


class _BadMetrics(http.server.BaseHTTPRequestHandler):
    """A /metrics endpoint whose partition label is not a partition ID."""

    def do_GET(self) -> None:
        body = b'waltz_server_partition_pending_records{partition="p-1"} 5\n'
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_target_with_a_malformed_partition_label_is_that_targets_error(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _BadMetrics)
    thread = threading.Thread(target=server.serve_forever, name="bad-metrics", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    console = launch_console(
        tmp_path, cluster, "--metrics", f"bad={url}", name="console-bad-target", env=operator_env(cluster)
    )
    try:
        console.wait_ready()

        def targets() -> str | None:
            page = request(console.url + "fragments/metrics")[1]
            good = len(re.findall(r"data-up=\"yes\"", page)) == len(cluster.metrics_urls())
            return page if good else None

        page = wait_until(targets, timeout=30, what="every good target to be up", interval=0.2)
        assert re.search(r'data-target="bad" data-up="no">.*?partition label .*?p-1', page, re.S), page
        looked = console.get_json("/api/map.json")
        assert looked["error"] is None and looked["map"] is not None
        rounds = looked["round"]
        wait_until(
            lambda: console.get_json("/api/map.json")["round"] > rounds + 2,
            timeout=30,
            what="later looks to go on",
            interval=0.2,
        )
        assert console.get_json("/api/map.json")["error"] is None
    finally:
        console.close()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


#: The size of a flooding target's reply: eight times what the console reads of one.
FLOOD_BYTES = 64 * 1024 * 1024


class _TargetHandler(http.server.BaseHTTPRequestHandler):
    server: _Target

    def do_GET(self) -> None:
        target = self.server
        reply = target.reply
        try:
            if reply == "good":
                body = b"# TYPE x gauge\nx 1\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            elif reply == "drip":
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", "1000000")
                self.end_headers()
                deadline = time.monotonic() + 60
                while not target.closing.is_set() and time.monotonic() < deadline:
                    self.wfile.write(b"#")
                    target.closing.wait(0.2)
            else:  # "flood" with its Content-Length, "flood-unsized" without (the connection's end ends it)
                chunk = (b"# " + b"x" * 1021 + b"\n") * 1024
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                if reply == "flood":
                    self.send_header("Content-Length", str(FLOOD_BYTES))
                self.end_headers()
                sent = 0
                for _ in range(FLOOD_BYTES // len(chunk)):
                    if target.closing.is_set():
                        break
                    self.wfile.write(chunk)
                    sent += len(chunk)
                    with target.lock:
                        target.most_sent = max(target.most_sent, sent)
        except OSError:  # the console hung up
            pass

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Target(http.server.ThreadingHTTPServer):
    """A /metrics endpoint on 127.0.0.1 whose reply the test sets (:attr:`reply`): ``good`` (one
    gauge), ``drip`` (a byte every 0.2 s of a declared million, for at most 60 s), ``flood``
    (:data:`FLOOD_BYTES` declared and sent as fast as read) or ``flood-unsized`` (the same without
    Content-Length). It records the most bytes of one reply it could send."""

    daemon_threads = True

    def __init__(self, reply: str) -> None:
        super().__init__(("127.0.0.1", 0), _TargetHandler)
        self.reply = reply
        self.closing = threading.Event()
        self.lock = threading.Lock()
        self.most_sent = 0
        self.thread = threading.Thread(target=self.serve_forever, name=f"{reply}-metrics", daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/metrics"

    def close(self) -> None:
        self.closing.set()
        self.shutdown()
        self.server_close()
        self.thread.join(timeout=10)


def _target_row(console: RunningConsole, name: str, up: str, says: str = "") -> str | None:
    """The metrics table's row of target ``name`` once it shows ``up`` (and ``says`` when down)."""
    page = request(console.url + "fragments/metrics")[1]
    found = re.search(rf'<tr [^>]*data-target="{name}" data-up="{up}">.*?</tr>', page, re.S)
    return found.group() if found is not None and says in found.group() else None


def _stopped_by_sigterm(console: RunningConsole) -> tuple[int | None, float]:
    """SIGTERM the console: its exit code (killed after 10 s) and the seconds it took."""
    started = time.monotonic()
    code = console.process.terminate(timeout=10)
    return code, time.monotonic() - started


def test_a_target_that_drips_its_reply_times_out_and_the_looks_and_actions_go_on(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """docs/design/console.md "Metrics": each scrape has a deadline over the whole reply."""
    target = _Target("good")
    console = launch_console(
        tmp_path,
        cluster,
        "--operator",
        "--metrics",
        f"slow={target.url}",
        name="console-dripping-target",
        env={**os.environ, **cluster.admin_env("admin")},
    )
    try:
        console.wait_ready()
        wait_until(lambda: _target_row(console, "slow", "yes"), timeout=30, what="it up", interval=0.2)
        target.reply = "drip"  # every reply from now on: a byte every 0.2 s, never ending in time
        row = wait_until(
            lambda: _target_row(console, "slow", "no", "timed out"),
            timeout=30,
            what="the dripping target down, timed out",
            interval=0.2,
        )
        assert "within" in row, row
        # The looks go on: the map, ZooKeeper's health and the other targets keep being read.
        looked = console.get_json("/api/map.json")
        wait_until(
            lambda: console.get_json("/api/map.json")["round"] > looked["round"] + 3,
            timeout=30,
            what="later looks while the target drips",
            interval=0.2,
        )
        later = console.get_json("/api/map.json")
        assert later["error"] is None and later["map"]["taken_at"] > looked["map"]["taken_at"], later
        assert _target_row(console, "storage-0", "yes") is not None

        # A done action answers without waiting for a look (re-assigning a replica changes nothing).
        holder = assigned(cluster, 0)[0]
        token = {"X-Console-Token": console.token()}

        def assigned_again() -> str | None:
            statuses, text = act_and_read(
                console, f"kind=add-replica&partition=0&storage={holder}", headers=token
            )
            assert statuses in ([200, 200], [200, 409]), (statuses, text)
            return text if statuses == [200, 200] else None  # 409: the safety rules want a caught-up replica

        text = wait_until(
            assigned_again, timeout=60, what="the action to answer", interval=0.5, abort_on=(AssertionError,)
        )
        assert "was already assigned" in text, text

        code, took = _stopped_by_sigterm(console)
        assert code == 0 and took < 10, (code, took, console.log())
    finally:
        console.close()
        target.close()


def test_a_console_whose_target_drips_from_the_start_serves_and_sigterm_stops_it(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    target = _Target("drip")
    try:
        # Stopped while its first look is under way.
        starting = launch_console(
            tmp_path,
            cluster,
            "--metrics",
            f"slow={target.url}",
            name="console-stopped-starting",
            env=operator_env(cluster),
        )
        try:
            starting.start_url()
            code, took = _stopped_by_sigterm(starting)
            assert code == 0 and took < 10, (code, took, starting.log())
        finally:
            starting.close()

        console = launch_console(
            tmp_path,
            cluster,
            "--metrics",
            f"slow={target.url}",
            name="console-dripping-from-start",
            env=operator_env(cluster),
        )
        try:
            console.wait_ready()
            wait_until(
                lambda: _target_row(console, "slow", "no", "timed out"),
                timeout=30,
                what="the dripping target down, timed out",
                interval=0.2,
            )
            code, took = _stopped_by_sigterm(console)
            assert code == 0 and took < 10, (code, took, console.log())
            assert "Traceback" not in console.log()
        finally:
            console.close()
    finally:
        target.close()


def test_a_reply_over_the_limit_is_that_targets_error_and_is_not_read_whole(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """docs/design/console.md "Metrics": at most 8 MiB of a reply is read, whatever it declares."""
    sized, unsized = _Target("flood"), _Target("flood-unsized")
    console = launch_console(
        tmp_path,
        cluster,
        "--metrics",
        f"sized={sized.url}",
        "--metrics",
        f"unsized={unsized.url}",
        name="console-flooding-targets",
        env=operator_env(cluster),
    )
    try:
        console.wait_ready()
        rows = {
            name: wait_until(
                functools.partial(_target_row, console, name, "no"),
                timeout=30,
                what=f"the target {name} down",
                interval=0.2,
            )
            for name in ("sized", "unsized")
        }
        # What was sent is what the console read and what the sockets' buffers took: a declared
        # length over the limit is refused before any of the body is read, a body past it is
        # dropped as soon as it passes 8 MiB.
        assert sized.most_sent < FLOOD_BYTES // 4, sized.most_sent
        assert unsized.most_sent < FLOOD_BYTES // 2, unsized.most_sent
        assert f"larger than 8388608 bytes (Content-Length {FLOOD_BYTES})" in rows["sized"], rows
        assert "larger than 8388608 bytes" in rows["unsized"], rows
        assert console.get_json("/api/map.json")["error"] is None
    finally:
        console.close()
        sized.close()
        unsized.close()


def test_in_a_browser_an_action_that_failed_shows_what_failed(
    cluster: LocalCluster, consoles: dict[str, RunningConsole], chromium: Any
) -> None:
    """docs/console.md "Operator actions": a failed action (502) shows *Not done* and why."""
    expect: Any = pytest.importorskip("playwright.sync_api").expect
    console = consoles["operator"]
    second = assigned(cluster, 0)[1]
    context = chromium.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = context.new_page()
        statuses: list[int] = []
        page.goto(console.start_url())
        expect(page.locator("#mode")).to_have_text("operator")

        def removal_shown() -> str | None:
            page.select_option("#action-kind", "remove-replica")
            page.select_option("#action-partition", "0")
            page.select_option("#action-storage", second)
            page.click("#action-submit")
            expect(page.locator("#confirmation")).to_be_visible()
            with page.expect_response(lambda response: "/actions/run" in response.url) as answer:
                page.click("#action-confirm")
            statuses.append(answer.value.status)
            if statuses[-1] == 409:  # the safety rules want a caught-up replica first
                return None
            outcome = page.locator("#action-outcome")
            expect(outcome).to_have_attribute("data-ok", "no")
            return str(outcome.inner_text())

        text = wait_until(
            removal_shown, timeout=90, what="the removal to run", interval=0.5, abort_on=(AssertionError,)
        )
        assert statuses[-1] == 502, statuses
        assert text.startswith("Not done:") and "urn:waltz:role:admin" in text, text
        assert second in assigned(cluster, 0)
    finally:
        context.close()
