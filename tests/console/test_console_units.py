"""The console's parts that need no cluster: settings, metrics arithmetic, confirmations, routes,
package data and the message without the extra (docs/design/console.md "Metrics", "Operator
actions", "Serving")."""

from __future__ import annotations

import fnmatch
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from waltz.batched_histogram import BatchedHistogram
from waltz.console.actions import Action, ActionKind, Confirmations
from waltz.console.config import ConsoleConfig, MetricsTarget
from waltz.console.metrics import MetricsHistory, derive, histogram_quantile, parse_scrape
from waltz.errors import ConfigurationError

pytest.importorskip("starlette", reason="the console extra is not installed")

ROOT = Path(__file__).resolve().parents[2]


def test_metrics_targets_parse_with_or_without_a_name() -> None:
    assert MetricsTarget.parse("http://127.0.0.1:9100/metrics") == MetricsTarget(
        "127.0.0.1:9100", "http://127.0.0.1:9100/metrics"
    )
    assert MetricsTarget.parse("server-0=https://h:1/metrics") == MetricsTarget(
        "server-0", "https://h:1/metrics"
    )
    for bad in ("127.0.0.1:9100", "ftp://h/metrics", "x=", "http://"):
        with pytest.raises(ConfigurationError):
            MetricsTarget.parse(bad)
    config = ConsoleConfig(console_metrics=["http://h:1/metrics", "http://h:1/metrics"])
    assert [t.name for t in config.metrics_targets()] == ["h:1", "h:1#2"]


def test_https_needs_both_files_and_a_ca_needs_a_certificate(tmp_path: Path) -> None:
    cert = tmp_path / "c.pem"
    with pytest.raises(ValueError, match="set together"):
        ConsoleConfig(console_ssl_cert_file=cert)
    with pytest.raises(ValueError, match="caFile needs"):
        ConsoleConfig(console_ssl_ca_file=cert)
    assert ConsoleConfig().console_host == "127.0.0.1"
    # Operator actions beyond loopback only with browser certificates.
    with pytest.raises(ValueError, match="need browser certificates"):
        ConsoleConfig(console_host="0.0.0.0", console_operator=True)
    assert ConsoleConfig(console_host="0.0.0.0").console_operator is False
    assert ConsoleConfig(console_operator=True).console_host == "127.0.0.1"


class ServerLike:
    """The metrics a server exports, in a registry of the test's own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.committed = Counter("waltz_server_committed_records", "", ["partition"], registry=self.registry)
        self.lock_failures = Gauge(
            "waltz_server_partition_lock_failures", "", ["partition"], registry=self.registry
        )
        self.latency = BatchedHistogram(
            "waltz_server_commit_seconds", "", buckets=(0.001, 0.01, 0.1), registry=self.registry
        )

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def test_rates_and_quantiles_come_from_two_scrapes() -> None:
    server = ServerLike()
    target = MetricsTarget("server-0", "http://h:1/metrics")
    server.committed.labels("0").inc(100)
    first = parse_scrape(target, server.text(), at=10.0)
    server.committed.labels("0").inc(50)
    server.committed.labels("1").inc(20)
    server.lock_failures.labels("0").set(4)
    for _ in range(99):
        server.latency.observe(0.005)
    server.latency.observe(0.05)
    second = parse_scrape(target, server.text(), at=12.0)
    assert second.kind == "server"

    partitions, targets = derive([second], {"server-0": first})
    assert partitions[0].commits_per_second == pytest.approx(25.0)
    assert partitions[1].commits_per_second == pytest.approx(10.0)  # new series: counted from 0
    assert partitions[0].lock_failures_per_second == pytest.approx(2.0)
    assert partitions[0].apply_backlog is None  # no client among the targets
    (figures,) = targets
    assert figures.up and figures.per_second == pytest.approx(35.0)
    assert figures.p50_ms is not None and 1.0 < figures.p50_ms <= 10.0
    assert figures.p99_ms == pytest.approx(10.0)  # 99 of 100 at or below the 10 ms bound

    # The server restarted: its counter went down, and counts from zero.
    restarted = ServerLike()
    restarted.committed.labels("0").inc(6)
    third = parse_scrape(target, restarted.text(), at=14.0)
    partitions, _ = derive([third], {"server-0": second})
    assert partitions[0].commits_per_second == pytest.approx(3.0)


def test_the_first_scrape_gives_no_rate_and_a_failed_one_says_why() -> None:
    target = MetricsTarget("s", "http://h:1/metrics")
    partitions, targets = derive([parse_scrape(target, ServerLike().text(), at=1.0)], {})
    assert all(p.commits_per_second == 0 for p in partitions.values())
    assert targets[0].p99_ms is None
    from waltz.console.metrics import Scrape

    _, targets = derive([Scrape(target, 2.0, error="ConnectError: refused")], {})
    assert not targets[0].up and targets[0].error == "ConnectError: refused"


def test_histogram_quantile_interpolates_within_a_bucket() -> None:
    buckets = [(1.0, 0.0), (2.0, 100.0), (float("inf"), 100.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(1.5)
    assert histogram_quantile(0.99, [(1.0, 0.0), (float("inf"), 10.0)]) == 1.0
    assert histogram_quantile(0.5, [(1.0, 0.0), (float("inf"), 0.0)]) is None


def test_chart_series_line_up_with_the_rounds() -> None:
    history = MetricsHistory(size=3)
    server = ServerLike()
    target = MetricsTarget("server-0", "http://h:1/metrics")
    previous = {}
    for round_ in range(5):
        server.committed.labels("0").inc(10)
        scrape = parse_scrape(target, server.text(), at=float(round_))
        partitions, targets = derive([scrape], previous)
        previous = {"server-0": scrape}
        history.add(1000.0 + round_, partitions, targets)
    charts = {c["id"]: c for c in history.charts()}
    commits = charts["commits"]
    assert commits["series"] == ["p0"]
    assert commits["data"][0] == [1002.0, 1003.0, 1004.0]  # the last three rounds
    assert commits["data"][1] == [10.0, 10.0, 10.0]


def test_a_confirmation_is_used_once_and_expires() -> None:
    action = Action.parse("remove-replica", "1", "127.0.0.1:5", None)
    assert action == Action(ActionKind.REMOVE_REPLICA, 1, "127.0.0.1:5")
    assert "unassign 127.0.0.1:5 --partition 1" in action.command()
    confirmations = Confirmations()
    token = confirmations.issue(action)
    assert confirmations.take("not-a-token") is None
    assert confirmations.take(token) == action
    assert confirmations.take(token) is None
    expired = Confirmations(ttl=0.0)
    assert expired.take(expired.issue(action)) is None
    # Only who asked can confirm; another requester uses the token up for nothing.
    owned = confirmations.issue(action, "certificate:CN=alice")
    assert confirmations.take(owned, "certificate:CN=bob") is None
    assert confirmations.take(owned, "certificate:CN=alice") is None


def test_each_action_needs_its_role_and_the_token_is_not_shown_twice() -> None:
    from waltz.console.access import ACTION_ROLES, READ_ROLES, AccessMode, ConsoleAccess, Requester
    from waltz.protocol.roles import Role

    assert {
        ActionKind.ADD_REPLICA: {Role.ADMIN},
        ActionKind.REMOVE_REPLICA: {Role.ADMIN},
        ActionKind.RECOVER_PARTITION: {Role.ADMIN},
    } == ACTION_ROLES
    assert {Role.OPERATOR, Role.ADMIN} == READ_ROLES
    rule = ConsoleAccess(AccessMode.CERTIFICATES)
    assert rule.start_url("https://h:1/") == "https://h:1/"
    operator = Requester("127.0.0.1:9", "CN=o", frozenset({Role.OPERATOR}))
    assert rule.allowed_actions(operator) == []
    assert "urn:waltz:role:admin" in (rule.acting_denial(operator) or "")
    admin = Requester("127.0.0.1:9", "CN=a", frozenset({Role.ADMIN}))
    assert rule.allowed_actions(admin) == list(ActionKind)
    assert rule.allowed_actions(Requester("127.0.0.1:9", "CN=c", frozenset({Role.CLIENT}))) == []
    assert "browser certificate" in (rule.acting_denial(Requester("127.0.0.1:9")) or "")
    tokens = {ConsoleAccess(AccessMode.TOKEN).start_url("http://h:1/") for _ in range(3)}
    assert len(tokens) == 3 and all(len(url.partition("?token=")[2]) >= 40 for url in tokens)


@pytest.mark.parametrize(
    ("kind", "partition", "storage", "source", "problem"),
    [
        ("drop-cluster", "1", "h:1", None, "unknown action"),
        ("add-replica", "x", "h:1", None, "not a partition"),
        ("add-replica", "²", "h:1", None, "digits 0-9"),
        ("add-replica", "١", "h:1", None, "digits 0-9"),
        ("add-replica", "1", "h:1\nINFO forged", None, "host:port"),
        ("add-replica", "1", "h", None, "host:port"),
        ("add-replica", "1", "h:99999", None, "host:port"),
        ("recover-partition", "1", "h:1", "h:2\rINFO x", "host:port"),
        ("add-replica", "1", " ", None, "storage node"),
        ("recover-partition", "1", "h:1", None, "source"),
        ("recover-partition", "1", "h:1", "h:1", "same storage node"),
    ],
)
def test_a_malformed_action_is_refused(
    kind: str, partition: str, storage: str, source: str | None, problem: str
) -> None:
    with pytest.raises(ConfigurationError, match=problem):
        Action.parse(kind, partition, storage, source)


def _methods(operator: bool) -> dict[str, set[str]]:
    from starlette.routing import Mount, Route

    from waltz.console.app import create_app

    app = create_app(
        ConsoleConfig(
            zookeeper_connect_string="127.0.0.1:1", cluster_root="/waltz/x", console_operator=operator
        )
    )
    found: dict[str, set[str]] = {}
    for route in app.routes:
        if isinstance(route, Route):
            found[route.path] = set(route.methods or ())
        else:
            assert isinstance(route, Mount) and route.path == "/static", route
    return found


def test_without_operator_every_route_is_read_only() -> None:
    read_only = _methods(operator=False)
    assert all(methods <= {"GET", "HEAD"} for methods in read_only.values()), read_only
    operator = _methods(operator=True)
    assert {path for path, m in operator.items() if "POST" in m} == {"/actions/confirm", "/actions/run"}


def test_the_package_data_holds_every_console_file() -> None:
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    missing = []
    for folder in ("static", "templates"):
        patterns = package_data[f"waltz.console.{folder}"]
        missing += [
            f"{folder}/{p.name}"
            for p in (ROOT / "waltz" / "console" / folder).iterdir()
            if not any(fnmatch.fnmatch(p.name, pattern) for pattern in patterns)
        ]
    assert not missing, f"not installed with the package: {missing}"
    packages = (ROOT / "setup.py").read_text()
    assert '"waltz.console.static"' in packages and '"waltz.console.templates"' in packages


def test_without_the_extra_the_command_says_what_to_install() -> None:
    # A None in sys.modules makes an import fail as a package that is not installed does.
    blocker = (
        "import sys\n"
        "sys.modules['starlette'] = sys.modules['uvicorn'] = None\n"
        "from waltz.cli.main import main\n"
        "main(['console', '--zookeeper', '127.0.0.1:1', '--root', '/waltz/x'])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", blocker], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2, result.stderr
    assert "pip install 'waltz-py[console]'" in result.stderr
    assert "starlette" in result.stderr


def test_a_partition_label_that_is_no_partition_id_is_that_targets_error_alone() -> None:
    bad, good = (
        MetricsTarget("bad", "http://127.0.0.1:1/metrics"),
        MetricsTarget("good", "http://127.0.0.1:2/metrics"),
    )
    text = 'waltz_server_partition_pending_records{{partition="{}"}} 5\n'
    scrapes = [parse_scrape(bad, text.format("p-1"), 1.0), parse_scrape(good, text.format("3"), 1.0)]
    partitions, targets = derive(scrapes, {})
    assert [(t.name, t.up) for t in targets] == [("bad", False), ("good", True)]
    assert "partition label 'p-1'" in (targets[0].error or "")
    assert list(partitions) == [3] and partitions[3].pending_records == 5.0


def test_audit_records_escape_control_characters() -> None:
    from waltz.console.app import escape_control

    assert escape_control("a\nb\r\x1b\u2028c") == "a\\nb\\r\\x1b\\u2028c"
    assert escape_control("plain: text") == "plain: text"
