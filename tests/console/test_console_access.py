"""Who may read the console and run its actions, over real sockets against a real local cluster
(docs/design/console.md "Access"; docs/console.md "Operator actions").

Two ``waltz console --operator`` processes serve the module: one over HTTPS that requires browser
certificates made by :func:`~waltz.local.certificates.make_cluster_certificates` (roles ``client``,
``server``, ``operator``, ``admin``), one on loopback over plain HTTP, whose actions need the token
of its start line. Requests go over real sockets with ``urllib``; the page's behaviour is checked
in headless chromium, which presents the certificates (Playwright's ``client_certificates``).
"""

from __future__ import annotations

import re
import socket
import ssl
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlsplit

import pytest

from tests.console.console_helpers import RunningConsole, act, assigned_storages, launch_console, request
from waltz.local.certificates import ClusterCertificates, make_cluster_certificates
from waltz.local.cluster import LocalCluster
from waltz.local.processes import wait_until

pytest.importorskip("starlette", reason="the console extra is not installed")

pytestmark = pytest.mark.security


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> ClusterCertificates:
    return make_cluster_certificates(tmp_path_factory.mktemp("console-roles"))


def browser(certificates: ClusterCertificates, name: str) -> ssl.SSLContext:
    """A client context presenting the certificate ``name`` (``client``, ``node``, ``operator``,
    ``admin``) and trusting the console's CA."""
    context = ssl.create_default_context(cafile=str(certificates.ca_file))
    context.load_cert_chain(certificates.cert_file(name), certificates.key_file(name))
    return context


@pytest.fixture(scope="module")
def consoles(
    console_cluster: LocalCluster,
    tmp_path_factory: pytest.TempPathFactory,
    certificates: ClusterCertificates,
) -> Iterator[dict[str, RunningConsole]]:
    logs = tmp_path_factory.mktemp("access-consoles")
    https = (
        "--tls-cert",
        str(certificates.cert_file("node")),
        "--tls-key",
        str(certificates.key_file("node")),
        "--tls-ca",
        str(certificates.ca_file),
    )
    started: dict[str, RunningConsole] = {}
    try:
        started["certificates"] = launch_console(
            logs,
            console_cluster,
            "--operator",
            *https,
            name="console-certificates",
            tls=browser(certificates, "operator"),
        )
        started["token"] = launch_console(logs, console_cluster, "--operator", name="console-token")
        for console in started.values():
            console.wait_ready()
        yield started
    finally:
        for console in started.values():
            console.close()


def act_when_safe(
    console: RunningConsole,
    form: str,
    context: ssl.SSLContext | None = None,
    headers: dict[str, str] | None = None,
) -> None:
    """Run an allowed action, asking again while the replica safety rules refuse it (409: the
    replicas of the store session the last change started have not caught up yet)."""

    def attempt() -> bool:
        statuses = act(console, form, context, headers)
        assert statuses in ([200, 200], [200, 409]), statuses
        return statuses == [200, 200]

    wait_until(
        attempt, timeout=30, what=f"{form} to pass the safety rules", interval=0.5, abort_on=(AssertionError,)
    )


def assignments(cluster: LocalCluster) -> dict[int, list[str]]:
    return {p: sorted(assigned_storages(cluster, p)) for p in range(cluster.num_partitions)}


def action_forms(cluster: LocalCluster) -> list[str]:
    """One valid form of each action against the cluster (two of them change it when run)."""
    first, second = cluster.storages[0].address, cluster.storages[1].address
    return [
        f"kind=remove-replica&partition=1&storage={second}",
        f"kind=add-replica&partition=0&storage={first}",
        f"kind=recover-partition&partition=0&storage={second}&source={first}",
    ]


@pytest.mark.parametrize("role_name", ["client", "node"])
def test_a_client_or_node_certificate_can_neither_read_nor_act(
    cluster: LocalCluster,
    consoles: dict[str, RunningConsole],
    certificates: ClusterCertificates,
    role_name: str,
) -> None:
    cluster.wait_ready()
    console = consoles["certificates"]
    context = browser(certificates, role_name)
    before = assignments(cluster)
    for form in action_forms(cluster):
        assert act(console, form, context) == [403], form
    status, text = request(console.url + "actions/run", "token=anything", context)
    assert status == 403 and "urn:waltz:role:admin" in text, text
    assert assignments(cluster) == before
    for path in ("", "api/map.json", "fragments/map"):
        status, text = request(console.url + path, context=context)
        assert status == 403, path
        assert "urn:waltz:role:operator" in text and "'cluster_key'" not in text, text
    # The page's libraries carry nothing of the cluster.
    assert request(console.url + "static/console.js", context=context)[0] == 200


def test_only_an_admin_certificate_changes_replicas(
    cluster: LocalCluster, consoles: dict[str, RunningConsole], certificates: ClusterCertificates
) -> None:
    cluster.wait_ready()
    console = consoles["certificates"]
    operator, admin = browser(certificates, "operator"), browser(certificates, "admin")
    storage = cluster.storages[1].address
    assert storage in assigned_storages(cluster, 1)
    remove = f"kind=remove-replica&partition=1&storage={storage}"
    add = f"kind=add-replica&partition=1&storage={storage}"

    # The operator reads, and is offered no action: each needs the admin role, as on the nodes.
    status, page = request(console.url, context=operator)
    assert status == 200 and 'id="no-actions"' in page and 'value="add-replica"' not in page, page
    status, page = request(console.url, context=admin)
    assert status == 200 and 'value="add-replica"' in page and 'value="remove-replica"' in page
    assert 'value="recover-partition"' in page

    first = cluster.storages[0].address
    for form in (remove, add, f"kind=recover-partition&partition=0&storage={storage}&source={first}"):
        assert act(console, form, operator) == [403], form
    assert storage in assigned_storages(cluster, 1)
    act_when_safe(console, remove, admin)
    assert storage not in assigned_storages(cluster, 1)
    assert act(console, add, operator) == [403]
    assert storage not in assigned_storages(cluster, 1)

    # A confirmation belongs to whoever asked for it.
    status, text = request(console.url + "actions/confirm", add, admin)
    confirmation = re.search(r'name="token" value="([^"]+)"', text)
    assert status == 200 and confirmation is not None, text
    assert request(console.url + "actions/run", f"token={confirmation.group(1)}", operator)[0] == 403
    other = browser(certificates, "node")
    assert request(console.url + "actions/run", f"token={confirmation.group(1)}", other)[0] == 403
    assert storage not in assigned_storages(cluster, 1)

    act_when_safe(console, add, admin)
    assert storage in assigned_storages(cluster, 1)


def test_the_action_log_names_the_subject_and_the_role(
    cluster: LocalCluster, consoles: dict[str, RunningConsole], certificates: ClusterCertificates
) -> None:
    cluster.wait_ready()
    console = consoles["certificates"]
    storage = cluster.storages[0].address
    assert storage in assigned_storages(cluster, 0)
    form = f"kind=add-replica&partition=0&storage={storage}"
    assert act(console, form, browser(certificates, "admin")) == [200, 200]
    assert act(console, form, browser(certificates, "client")) == [403]
    command = f"waltz cluster storage assign {storage} --partition 0"

    def lines() -> tuple[str, str] | None:
        log = console.log()
        done = re.search(
            rf"INFO waltz\.console\.audit .*{re.escape(command)} by certificate 'CN=waltz-admin' "
            r"\(roles: admin\) from 127\.0\.0\.1:\d+ done: .*was already assigned.*",
            log,
        )
        refused = re.search(
            # Refused before its form is read: who may run no action gets no further.
            r"WARNING waltz\.console\.audit .* asking for an action by certificate "
            r"'CN=waltz-client' \(roles: client\) from 127\.0\.0\.1:\d+ refused: .*urn:waltz:role:admin.*",
            log,
        )
        return (done.group(0), refused.group(0)) if done and refused else None

    done, refused = wait_until(lines, timeout=10, what="the console's audit lines", interval=0.1)
    assert "by certificate 'CN=waltz-admin' (roles: admin)" in done, done
    assert "by certificate 'CN=waltz-client' (roles: client)" in refused, refused


def test_on_loopback_an_action_without_the_start_token_is_refused(
    cluster: LocalCluster, consoles: dict[str, RunningConsole]
) -> None:
    cluster.wait_ready()
    console = consoles["token"]
    before = assignments(cluster)
    for form in action_forms(cluster):
        assert act(console, form) == [403], form
        assert act(console, form, headers={"X-Console-Token": "not-the-token"}) == [403], form
        assert act(console, form + "&console_token=not-the-token") == [403], form
    status, text = request(console.url + "actions/run", "token=anything")
    assert status == 403 and "token this console printed" in text, text
    assert assignments(cluster) == before
    # The pages stay readable on loopback.
    assert request(console.url + "api/map.json")[0] == 200


def test_on_loopback_the_start_token_runs_actions_and_shows_only_in_the_start_line(
    cluster: LocalCluster, consoles: dict[str, RunningConsole]
) -> None:
    cluster.wait_ready()
    console = consoles["token"]
    token = console.token()
    assert len(token) >= 40
    storage = cluster.storages[2].address
    assert storage in assigned_storages(cluster, 0)
    header = {"X-Console-Token": token}
    act_when_safe(console, f"kind=remove-replica&partition=0&storage={storage}", headers=header)
    assert storage not in assigned_storages(cluster, 0)
    act_when_safe(console, f"kind=add-replica&partition=0&storage={storage}&console_token={token}")
    assert storage in assigned_storages(cluster, 0)

    status, page = request(console.url)
    assert status == 200 and token not in page

    def logged() -> str | None:
        log = console.log()
        found = re.search(r".* by loopback token holder from 127\.0\.0\.1:\d+ done: .*", log)
        return log if found and "assign" in found.group(0) else None

    log = wait_until(logged, timeout=10, what="the token holder's audit line", interval=0.1)
    assert log.count(token) == 1, log
    [line] = [line for line in log.splitlines() if token in line]
    assert line.startswith("waltz console of ") and line.endswith("Ctrl-C stops it"), line
    assert line == f"waltz console of {cluster.root} at {console.url}?token={token} " + (
        "(operator: actions need this URL's token); Ctrl-C stops it"
    )


def test_in_a_browser_each_certificate_is_offered_only_what_its_role_allows(
    cluster: LocalCluster,
    consoles: dict[str, RunningConsole],
    certificates: ClusterCertificates,
    chromium: Any,
) -> None:
    expect: Any = pytest.importorskip("playwright.sync_api").expect
    cluster.wait_ready()
    console = consoles["certificates"]
    origin = console.url.rstrip("/")

    def page_as(name: str) -> Any:
        context = chromium.new_context(
            ignore_https_errors=True,  # the console's CA is the test's own
            client_certificates=[
                {
                    "origin": origin,
                    "certPath": str(certificates.cert_file(name)),
                    "keyPath": str(certificates.key_file(name)),
                }
            ],
        )
        return context, context.new_page()

    context, page = page_as("operator")
    try:
        page.goto(console.url)
        expect(page.locator("#mode")).to_have_text("operator")
        expect(page.locator("#action-kind option")).to_have_count(0)
        expect(page.locator("#no-actions")).to_contain_text("admin")
    finally:
        context.close()

    context, page = page_as("admin")
    try:
        page.goto(console.url)
        expect(page.locator("#action-kind option")).to_have_count(3)
        page.select_option("#action-kind", "add-replica")
        storage = cluster.storages[0].address
        page.select_option("#action-partition", "0")
        page.select_option("#action-storage", storage)
        page.click("#action-submit")
        page.click("#action-confirm")
        expect(page.locator("#action-outcome")).to_have_attribute("data-ok", "yes", timeout=30_000)
        expect(page.locator("#action-outcome")).to_contain_text("was already assigned")
    finally:
        context.close()

    context, page = page_as("client")
    try:
        response = page.goto(console.url)
        assert response is not None and response.status == 403
        expect(page.locator("body")).to_contain_text("urn:waltz:role:operator")
    finally:
        context.close()


def audit_line(console: RunningConsole, pattern: str) -> str:
    """The first audit line of ``console``'s log matching ``pattern`` (waited for)."""
    found = wait_until(
        lambda: re.search(pattern, console.log()), timeout=10, what=f"an audit line {pattern!r}", interval=0.1
    )
    return found.group(0)


def test_a_foreign_form_and_an_unknown_confirmation_are_audited(consoles: dict[str, RunningConsole]) -> None:
    console = consoles["token"]
    token = {"X-Console-Token": console.token()}
    foreign = {"Origin": "https://evil.example", **token}
    assert request(console.url + "actions/confirm", "kind=add-replica", headers=foreign)[0] == 403
    audit_line(
        console,
        r"WARNING waltz\.console\.audit .*POST /actions/confirm by loopback token holder from "
        r"127\.0\.0\.1:\d+ refused: a form from https://evil\.example is not the console's own",
    )
    status, text = request(console.url + "actions/run", "token=never-issued", headers=token)
    assert status == 409 and "unknown, used or expired" in text, text
    audit_line(
        console,
        r"WARNING waltz\.console\.audit .*running a confirmation by loopback token holder from "
        r"127\.0\.0\.1:\d+ refused: the confirmation is unknown, used or expired",
    )


def test_a_malformed_storage_node_or_partition_is_refused_and_the_audit_log_stays_one_line_per_record(
    cluster: LocalCluster, consoles: dict[str, RunningConsole]
) -> None:
    console = consoles["token"]
    token = {"X-Console-Token": console.token()}
    forged = "INFO waltz.console.audit [1] console: forged"
    storage = cluster.storages[0].address
    for form, problem in (
        (f"kind=add-replica&partition=0&storage={quote(storage + chr(10) + forged)}", "host:port"),
        ("kind=add-replica&partition=0&storage=127.0.0.1:1", "not a storage node of the cluster"),
        (f"kind=add-replica&partition={quote('²')}&storage={storage}", "digits 0-9"),
        (f"kind=recover-partition&partition=0&storage={storage}&source={quote('a b:1')}", "host:port"),
        (f"kind=add-replica&partition=99&storage={storage}", "partition 99 is not a partition of the"),
    ):
        status, text = request(console.url + "actions/confirm", form, headers=token)
        assert status == 422 and problem in text, (form, status, text)
    # A partition the map does not have is refused when asked for, not run and failed.
    audit_line(
        console,
        r"WARNING waltz\.console\.audit .*asking for an action by loopback token holder from "
        r"127\.0\.0\.1:\d+ refused: partition 99 is not a partition of the cluster: choose one of the "
        r"map's partitions \(0\.\.1\)",
    )
    assert "--partition 99 asked for" not in console.log(), console.log()
    # Without the token, a field is logged in the refusal: escaped, on the refusal's own line.
    assert request(console.url + "actions/confirm", f"kind={quote('x' + chr(10) + forged)}")[0] == 403
    audit_line(console, r"WARNING waltz\.console\.audit .*refused: .*")
    audit_line(
        console, re.escape(r"asking for an action by loopback token holder") + r".*\\n" + re.escape(forged)
    )
    assert not any(line.startswith(forged) for line in console.log().splitlines()), console.log()


def raw_post(console: RunningConsole, head: str, body: bytes = b"") -> bytes:
    """Send a POST's ``head`` (request line and headers) and ``body`` over a socket; the answer's
    bytes, read until the console closes the connection."""
    parts = urlsplit(console.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def test_a_form_over_the_limit_is_refused_before_it_is_read(consoles: dict[str, RunningConsole]) -> None:
    console = consoles["token"]
    parts = urlsplit(console.url)
    head = (
        f"POST /actions/confirm HTTP/1.1\nHost: {parts.netloc}\nX-Console-Token: {console.token()}\n"
        "Content-Type: application/x-www-form-urlencoded\n"
    )
    # 100 MB declared, none sent: the answer comes without the body.
    answer = raw_post(console, head + "Content-Length: 100000000\n")
    assert answer.startswith(b"HTTP/1.1 413 "), answer
    assert b"larger than 4096 bytes" in answer
    # A chunked body that never ends: the console stops reading past the limit.
    chunk = b"a" * 3000
    answer = raw_post(
        console, head + "Transfer-Encoding: chunked\n", (b"%x\r\n" % len(chunk) + chunk + b"\r\n") * 2
    )
    assert answer.startswith(b"HTTP/1.1 413 "), answer
    # Who may run no action is refused before any of the body is read.
    answer = raw_post(
        console,
        f"POST /actions/run HTTP/1.1\nHost: {parts.netloc}\nX-Console-Token: not-the-token\n"
        "Content-Length: 100000000\n",
    )
    assert answer.startswith(b"HTTP/1.1 413 ") or answer.startswith(b"HTTP/1.1 403 "), answer
