"""The console in a real browser against a real local cluster (docs/console.md; docs/design/console.md
"Cluster map", "Operator actions").

One cluster, two ``waltz console`` processes (read-only, and ``--operator``) and one headless
chromium serve every test of the module; the tests run in file order, the server kill last.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.tls import make_certificates

from tests.console.console_helpers import RunningConsole, launch_console
from waltz.local.cluster import LocalCluster
from waltz.local.processes import wait_until
from waltz.metadata.zk import ClusterZk
from waltz.protocol.records import ReqId
from waltz.protocol.server_client import ServerAdminClient

pytest.importorskip("starlette", reason="the console extra is not installed")
expect: Any = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed").expect

#: Seconds a browser expectation may take (a few refreshes, a session timeout for a killed server).
WAIT_MS = 30_000


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_certificates(tmp_path_factory.mktemp("console-tls"))


@pytest.fixture(scope="module")
def consoles(
    console_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory, certificates: dict[str, Path]
) -> Iterator[dict[str, RunningConsole]]:
    logs = tmp_path_factory.mktemp("consoles")
    files = certificates
    trusted = ssl.create_default_context(cafile=str(files["ca"]))
    trusted.load_cert_chain(files["client"], files["client-key"])
    https = (
        "--tls-cert",
        str(files["server"]),
        "--tls-key",
        str(files["server-key"]),
        "--tls-ca",
        str(files["ca"]),
    )
    started: dict[str, RunningConsole] = {}
    try:
        # Started together, they import and connect at the same time.
        started["read-only"] = launch_console(logs, console_cluster, name="console-read-only")
        started["operator"] = launch_console(logs, console_cluster, "--operator", name="console-operator")
        started["https"] = launch_console(logs, console_cluster, *https, name="console-https", tls=trusted)
        for console in started.values():
            console.wait_ready()
        yield started
    finally:
        for console in started.values():
            console.close()


@pytest.fixture
def page(chromium: Any) -> Iterator[Any]:
    context = chromium.new_context(viewport={"width": 1400, "height": 1000})
    try:
        yield context.new_page()
    finally:
        context.close()


def partition_row(page: Any, partition_id: int) -> Any:
    return page.locator(f'tr.partition[data-partition="{partition_id}"]')


def test_the_map_shows_every_partitions_owner(
    cluster: LocalCluster, consoles: dict[str, RunningConsole], page: Any
) -> None:
    page.goto(consoles["read-only"].url)
    expect(page.locator("#mode")).to_have_text("read-only")
    for partition_id in range(cluster.num_partitions):
        row = partition_row(page, partition_id)
        expect(row).to_have_attribute("data-owner-endpoint", cluster.owner(partition_id), timeout=WAIT_MS)
        expect(row).to_have_attribute("data-writable", "yes", timeout=WAIT_MS)
        expect(row.locator("li.replica")).to_have_count(cluster.replicas)
    expect(page.locator("tr.server")).to_have_count(len(cluster.servers))
    expect(page.locator("tr.storage")).to_have_count(len(cluster.storages))
    expect(page.locator("#zookeeper")).to_contain_text("healthy")
    expect(page.locator("tr.target[data-up='yes']")).to_have_count(
        len(cluster.metrics_urls()), timeout=WAIT_MS
    )
    # The charts are drawn by uPlot from the vendored file (no CDN).
    expect(page.locator('figure.chart[data-chart="commits"] canvas')).to_have_count(1, timeout=WAIT_MS)


def _post(
    url: str, body: str = "kind=add-replica&partition=0&storage=x", headers: dict[str, str] | None = None
) -> int:
    request = urllib.request.Request(url, data=body.encode(), method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def test_the_read_only_console_has_no_mutating_endpoint(
    cluster: LocalCluster, consoles: dict[str, RunningConsole], page: Any
) -> None:
    read_only, operator = consoles["read-only"], consoles["operator"]
    for path in ("actions/confirm", "actions/run", "", "fragments/map", "api/map.json"):
        assert _post(read_only.url + path) in (404, 405), path
    # The same request reaches the operator console's action (a form error, not a 404).
    assert _post(operator.url + "actions/confirm", headers={"X-Console-Token": operator.token()}) == 422
    page.goto(read_only.url)
    expect(page.locator("tr.partition")).to_have_count(cluster.num_partitions)
    expect(page.locator("#operator")).to_have_count(0)
    expect(page.locator("form")).to_have_count(0)


def test_a_request_for_another_host_name_is_refused(consoles: dict[str, RunningConsole]) -> None:
    """A page of another site whose name resolves to 127.0.0.1 (DNS rebinding) reads nothing."""
    operator = consoles["operator"]
    assert operator.get_json("/api/map.json")["map"] is not None  # addressed to 127.0.0.1
    for host in ("evil.example", f"evil.example:{operator.url.rsplit(':', 1)[1].strip('/')}"):
        request = urllib.request.Request(operator.url + "api/map.json", headers={"Host": host})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 400
    request = urllib.request.Request(operator.url.replace("127.0.0.1", "localhost"))
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200


def test_a_form_posted_by_another_origin_is_refused_and_the_map_carries_no_cluster_key(
    consoles: dict[str, RunningConsole],
) -> None:
    operator = consoles["operator"]
    own = operator.url.rstrip("/")
    token = {"X-Console-Token": operator.token()}
    assert _post(operator.url + "actions/confirm", headers={"Origin": own, **token}) == 422  # storage x
    for origin in ("https://evil.example", "http://127.0.0.1:1"):
        assert _post(operator.url + "actions/confirm", headers={"Origin": origin, **token}) == 403, origin
        assert _post(operator.url + "actions/run", "token=x", headers={"Origin": origin, **token}) == 403, (
            origin
        )
    assert "cluster_key" not in operator.get_json("/api/map.json")["map"]


def test_with_a_certificate_the_console_serves_https_only(
    cluster: LocalCluster, consoles: dict[str, RunningConsole], certificates: dict[str, Path]
) -> None:
    console = consoles["https"]
    assert console.get_json("/api/map.json")["map"]["root"] == cluster.root
    plain = console.url.replace("https://", "http://")
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(plain, timeout=5)
    anonymous = ssl.create_default_context(cafile=str(certificates["ca"]))  # shows no certificate
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        urllib.request.urlopen(console.url, timeout=5, context=anonymous).read()


async def _append(endpoint: str, generation: int, partition_id: int, count: int) -> int:
    async with ServerAdminClient(endpoint, timeout=10) as client:
        outcomes = await client.append(
            partition_id,
            [(ReqId(7, generation, partition_id, seq), 0, b"console" * 8) for seq in range(count)],
        )
    committed = [o for o in outcomes if isinstance(o, int)]
    assert len(committed) == count, outcomes
    return max(committed)


def test_a_replica_lag_shows_and_drains(
    cluster: LocalCluster, consoles: dict[str, RunningConsole], page: Any
) -> None:
    owners = cluster.wait_ready()
    stopped = cluster.storages[2].address
    page.goto(consoles["read-only"].url)
    replica = partition_row(page, 0).locator(f'li.replica[data-storage="{stopped}"]')
    expect(replica).to_have_attribute("data-lag", "0", timeout=WAIT_MS)

    cluster.stop_storage(2)
    expect(replica).to_have_attribute("data-reachable", "no", timeout=WAIT_MS)
    count = 40
    # Playwright's sync API runs an event loop on this thread: append from another one.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, _append(owners[0].endpoint, owners[0].generation, 0, count)).result(30)
    # Stopped, the replica shows how far it is behind from the last mark read from it.
    expect(replica).to_have_attribute("data-lag", str(count), timeout=WAIT_MS)
    expect(replica.locator(".lag")).to_have_text(f"lag ≥ {count}")

    cluster.restart_storage(2)
    expect(replica).to_have_attribute("data-reachable", "yes", timeout=WAIT_MS)
    expect(replica).to_have_attribute("data-lag", "0", timeout=WAIT_MS)


def _archive(cluster: LocalCluster, location: Path) -> dict[int, int]:
    """``waltz archive run --once`` of the whole log to ``location``; each partition's archived-through."""
    import subprocess
    import sys

    from waltz.archive.layout import ArchiveFiles
    from waltz.archive.manifests import read_partition_manifest

    where = ["--zookeeper", cluster.zookeeper_connect_string, "--root", cluster.root]
    command = [sys.executable, "-m", "waltz", "archive", "run", "--to", str(location), "--seal-after", "0"]
    result = subprocess.run([*command, *where], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    files = ArchiveFiles.open(str(location))
    return {p: read_partition_manifest(files, p).archived_through for p in range(cluster.num_partitions)}


def test_the_archived_range_and_the_replicas_local_ranges_show(
    cluster: LocalCluster, consoles: dict[str, RunningConsole], page: Any, tmp_path: Path
) -> None:
    owners = cluster.wait_ready()
    location = tmp_path / "archive"
    # Playwright's sync API runs an event loop on this thread: append and archive from another one.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        for partition, owner in owners.items():
            pool.submit(asyncio.run, _append(owner.endpoint, owner.generation, partition, 10)).result(30)
    archived = _archive(cluster, location)
    assert min(archived.values()) >= 9, archived
    # The round in progress may have probed the replicas before the archiver told them: the map read
    # below is from a round begun after the archive run ended.
    after = consoles["read-only"].get_json("/api/map.json")["round"] + 2
    page.goto(consoles["read-only"].url)
    expect(page.locator("#archive-location")).to_contain_text(str(location), timeout=WAIT_MS)
    for partition, through in archived.items():
        row = partition_row(page, partition)
        expect(row.locator("td.archived")).to_have_attribute(
            "data-archived-through", str(through), timeout=WAIT_MS
        )
        expect(row.locator("td.archived")).to_contain_text(f"through {through}")
        # Nothing deleted yet (retention is off): every replica holds its log from 0.
        expect(row.locator('li.replica[data-local-start="0"]')).to_have_count(cluster.replicas)

    def map_after_the_archive_run() -> Any:
        answer = consoles["read-only"].get_json("/api/map.json")
        return answer["map"] if answer["round"] >= after else None

    look = wait_until(
        map_after_the_archive_run,
        timeout=WAIT_MS / 1000,
        what=f"a console round begun after the archive run (round {after})",
        interval=0.1,
    )
    assert look["archive_location"] == str(location)
    for line in look["partitions"]:
        assert line["archived_through"] == archived[line["partition_id"]]
        assert line["archive_chunks"] >= 1 and line["archive_bytes"] > 0
        # Each replica reports its local range and what the archiver told it.
        assert {(r["local_start"], r["archived_through"]) for r in line["replicas"]} == {
            (0, archived[line["partition_id"]])
        }, line


def _assigned(cluster: LocalCluster, partition_id: int) -> list[str]:
    from kazoo.client import KazooClient

    client = KazooClient(hosts=cluster.zookeeper_connect_string)
    client.start(timeout=10)
    try:
        return ClusterZk(client, cluster.root).assignments().value.storages_of(partition_id)
    finally:
        client.stop()
        client.close()


def _act(page: Any, kind: str, partition_id: int, storage: str, *, confirmed: bool = True) -> None:
    page.select_option("#action-kind", kind)
    page.select_option("#action-partition", str(partition_id))
    page.select_option("#action-storage", storage)
    page.click("#action-submit")
    if confirmed:
        expect(page.locator("#confirmation")).to_be_visible()


def test_an_operator_action_asks_for_confirmation_and_takes_effect(
    cluster: LocalCluster, consoles: dict[str, RunningConsole], page: Any, tmp_path: Path
) -> None:
    cluster.wait_ready()
    storage = cluster.storages[1].address
    assert storage in _assigned(cluster, 1)
    # The start URL's token is taken out of the address bar and sent with every action.
    page.goto(consoles["operator"].start_url())
    expect(page).to_have_url(consoles["operator"].url)
    expect(page.locator("#mode")).to_have_text("operator")
    row = partition_row(page, 1)
    expect(row.locator(f'li.replica[data-storage="{storage}"]')).to_have_count(1)

    # A malformed action is refused on the page (a 422 that htmx swaps in), and nothing is asked.
    page.select_option("#action-source", storage)
    _act(page, "recover-partition", 1, storage, confirmed=False)
    expect(page.locator("#action-outcome")).to_have_attribute("data-ok", "no")
    expect(page.locator("#action-outcome")).to_contain_text("the source and the destination are the same")
    page.select_option("#action-source", "")

    _act(page, "remove-replica", 1, storage)
    expect(page.locator("#confirmation")).to_contain_text(
        f"Unassign the replica of partition 1 from storage node {storage}"
    )
    # Asking changed nothing; cancelling leaves it so.
    assert storage in _assigned(cluster, 1)
    page.click("#action-cancel")
    expect(page.locator("#confirmation")).to_have_count(0)
    assert storage in _assigned(cluster, 1)

    _act(page, "remove-replica", 1, storage)
    token = page.locator("#confirmation input[name=token]").input_value()
    page.click("#action-confirm")
    expect(page.locator("#action-outcome")).to_have_attribute("data-ok", "yes", timeout=WAIT_MS)
    assert storage not in _assigned(cluster, 1)
    expect(row.locator(f'li.replica[data-storage="{storage}"]')).to_have_count(0, timeout=WAIT_MS)
    page.screenshot(path=str(tmp_path / "after-remove.png"))

    # A confirmation is used once: posting its token again is refused.
    start_token = {"X-Console-Token": consoles["operator"].token()}
    assert _post(consoles["operator"].url + "actions/run", f"token={token}", start_token) == 409

    _act(page, "add-replica", 1, storage)
    page.click("#action-confirm")
    expect(page.locator("#action-outcome")).to_have_attribute("data-ok", "yes", timeout=WAIT_MS)
    assert storage in _assigned(cluster, 1)
    expect(row.locator(f'li.replica[data-storage="{storage}"]')).to_have_count(1, timeout=WAIT_MS)


def test_a_killed_server_disappears_and_its_partitions_move(
    cluster: LocalCluster, consoles: dict[str, RunningConsole], page: Any
) -> None:
    cluster.wait_ready()
    page.goto(consoles["read-only"].url)
    victim = cluster.owner_index(0)
    killed = cluster.servers[victim].endpoint
    survivor = cluster.servers[1 - victim].endpoint
    expect(page.locator(f'tr.server[data-endpoint="{killed}"]')).to_have_count(1)

    cluster.kill_server(victim)
    expect(page.locator(f'tr.server[data-endpoint="{killed}"]')).to_have_count(0, timeout=WAIT_MS)
    expect(page.locator("tr.server")).to_have_count(1)
    for partition_id in range(cluster.num_partitions):
        expect(partition_row(page, partition_id)).to_have_attribute(
            "data-owner-endpoint", survivor, timeout=WAIT_MS
        )
        expect(partition_row(page, partition_id)).to_have_attribute("data-writable", "yes", timeout=WAIT_MS)
    wait_until(lambda: cluster.owner(0) == survivor, timeout=5, what="ZooKeeper to agree with the page")
