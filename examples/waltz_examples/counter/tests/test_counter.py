"""The counter example (docs/design/overview.md "Why the log is the source of truth") against a real cluster.

Three :class:`CounterService` instances share one database and hammer a few hot counters with
increments and decrements that often exceed the value, while the server owning a partition is
killed with SIGKILL and restarted. What the example promises:

- no counter is ever negative, in any answer or any read;
- every committed change was applied exactly once, on the state it read: ordered by transaction
  ID, each change's answered value is the previous one plus its delta (no lost update, no
  double apply), and the final value is the sum of the answered changes;
- a refusal (``InsufficientCountError``) names a value the counter really held;
- the database catches up with the log (marks = the servers' high-water marks), with no apply
  error; contention shows as lock failures, which the service retries.

The HTTP API is tested through a real ``ThreadingHTTPServer`` on 127.0.0.1, the load generator
and the ``load`` command against it; ``serve`` and ``local`` refuse a ``--db`` they cannot use.
"""

from __future__ import annotations

import concurrent.futures
import functools
import http.client
import json
import logging
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from waltz.local.cluster import LocalCluster
from waltz.local.processes import free_port, wait_until
from waltz_examples.counter import CounterHttpServer, CounterService, InsufficientCountError
from waltz_examples.counter.cli import app
from waltz_examples.counter.load import run_load

#: Seconds a test waits for one outcome (a change, a catch-up, a failover).
TIMEOUT = 60.0
#: Changes the concurrency test makes in all, and the instances and threads making them.
OPERATIONS = 300
INSTANCES = 3
THREADS_PER_INSTANCE = 3
#: The change count after which the owner of a hot counter's partition is killed.
KILL_AFTER = 100


def start_services(cluster: LocalCluster, db_url: str, count: int) -> list[CounterService]:
    """``count`` instances on one database, started one after the other (the first creates the
    tables). The session's log is shared with other tests: their transactions are passed over."""
    settings = cluster.client_settings()  # the connect string, the root, the credential, the certificate
    zookeeper, root = str(settings.pop("zookeeper_connect_string")), str(settings.pop("cluster_root"))
    services: list[CounterService] = []
    try:
        for _ in range(count):
            services.append(
                CounterService(
                    db_url,
                    zookeeper,
                    root,
                    client_config={**settings, "zookeeper_session_timeout": 10.0},
                    request_timeout=TIMEOUT,
                    ignore_foreign_transactions=True,
                )
            )
    except BaseException:
        for service in services:
            service.close()
        raise
    return services


@pytest.fixture
def services(counter_cluster: LocalCluster, counter_db_url: str) -> Iterator[list[CounterService]]:
    """Three counter service instances sharing one fresh database; closed afterwards."""
    started = start_services(counter_cluster, counter_db_url, INSTANCES)
    try:
        yield started
    finally:
        for service in started:
            service.close()


@dataclass(frozen=True)
class Outcome:
    """What a caller was told about one change.

    Attributes:
        counter_id: the counter.
        delta: the change asked for.
        committed: True when it was answered with a new value, False when refused.
        value: the new value (committed) or the value the refusal named.
        partition_id: the counter's partition.
        transaction_id: the committing transaction of that partition (committed only).
    """

    counter_id: int
    delta: int
    committed: bool
    value: int
    partition_id: int
    transaction_id: int | None


def pick_counters(service: CounterService, rng: random.Random) -> list[int]:
    """Three counter IDs no other test uses: one in partition 0, one in partition 1, one anywhere."""
    chosen: list[int] = []
    for wanted in (0, 1, None):
        for _ in range(10_000):
            counter_id = rng.randrange(1, 1 << 62)
            if wanted is None or service.partition_of(counter_id) == wanted:
                chosen.append(counter_id)
                break
        else:
            raise AssertionError(f"no counter ID maps to partition {wanted} in 10,000 draws")
    return chosen


def caught_up(service: CounterService, server_marks: dict[int, int]) -> bool:
    """Whether the service's database applied the log up to the servers' marks."""
    return service.callbacks.high_water_marks() == server_marks


def test_instances_sharing_a_database_keep_counters_exact_and_never_negative_across_a_server_crash(
    services: list[CounterService], counter_cluster: LocalCluster
) -> None:
    cluster = counter_cluster
    rng = random.Random()
    counters = pick_counters(services[0], rng)
    partition_of = {c: services[0].partition_of(c) for c in counters}
    lock = threading.Lock()
    next_operation = 0
    outcomes: list[Outcome] = []
    lowest_read: list[int] = []
    done = threading.Event()

    def worker(service: CounterService, seed: int) -> None:
        nonlocal next_operation
        local_rng = random.Random(seed)
        for _ in range(OPERATIONS):  # bounded: each pass takes one of the OPERATIONS
            with lock:
                if next_operation >= OPERATIONS:
                    return
                next_operation += 1
            counter_id = local_rng.choice(counters)
            decrement = local_rng.random() < 0.4
            delta = -local_rng.randint(1, 15) if decrement else local_rng.randint(1, 10)
            try:
                update = service.change(counter_id, delta)
            except InsufficientCountError as refused:
                outcome = Outcome(counter_id, delta, False, refused.current, partition_of[counter_id], None)
            else:
                outcome = Outcome(
                    counter_id, delta, True, update.value, update.partition_id, update.transaction_id
                )
            with lock:
                outcomes.append(outcome)

    def observer() -> None:
        """Reads every counter through every instance while the changes run."""
        for _ in range(100_000):  # bounded; ends when the workers are done
            if done.wait(0.02):
                return
            values = [service.get(c) for service in services for c in counters]
            with lock:
                lowest_read.append(min(values))

    def completed() -> int:
        with lock:
            return len(outcomes)

    killed: list[str] = []

    def crash_and_heal() -> None:
        """Kill -9 the server owning the first hot counter's partition, mid-run; restart it."""
        wait_until(lambda: completed() >= KILL_AFTER, timeout=TIMEOUT, what=f"{KILL_AFTER} changes done")
        partition = services[0].partition_of(counters[0])
        index = cluster.owner_index(partition)
        cluster.kill_server(index)
        killed.append(f"server {index} (partition {partition}) after {completed()} changes")
        resumed_from = completed()
        wait_until(
            lambda: completed() >= min(OPERATIONS, resumed_from + 30),
            timeout=TIMEOUT,
            what="30 more changes after the owner was killed (its partitions fail over)",
        )
        cluster.heal(timeout=TIMEOUT)

    threads = INSTANCES * THREADS_PER_INSTANCE
    with concurrent.futures.ThreadPoolExecutor(threads + 2) as pool:
        background = [pool.submit(observer), pool.submit(crash_and_heal)]
        workers = [
            pool.submit(worker, services[i % INSTANCES], rng.randrange(1 << 30)) for i in range(threads)
        ]
        try:
            for job in workers:
                job.result(timeout=4 * TIMEOUT)
        finally:
            done.set()
        for job in background:
            job.result(timeout=2 * TIMEOUT)
    assert killed, "the server was never killed"
    assert len(outcomes) == OPERATIONS

    # The databases caught up with the log: marks = the servers' high-water marks.
    for service in services:
        service.client.flush(TIMEOUT)
    client = services[0].client
    server_marks = {p: client.get_high_water_mark(p, timeout=TIMEOUT) for p in range(client.num_partitions)}
    for service in services:
        wait_until(
            functools.partial(caught_up, service, server_marks),
            timeout=TIMEOUT,
            what=f"the database's marks to reach the servers' {server_marks}",
        )

    # Never negative, in any answer or any read.
    assert min(o.value for o in outcomes) >= 0
    assert lowest_read and min(lowest_read) >= 0
    committed = [o for o in outcomes if o.committed]
    refused = [o for o in outcomes if not o.committed]
    assert refused, "no decrement was ever refused: the test did not exercise the constraint"
    assert all(o.delta < 0 and o.value < -o.delta for o in refused)
    ids = [(o.partition_id, o.transaction_id) for o in committed]
    assert len(set(ids)) == len(ids), "two changes were answered with the same transaction"
    assert all(o.partition_id == partition_of[o.counter_id] for o in committed)

    for counter_id in counters:
        # In log order, each committed change moved the counter from the previous value by its delta.
        history = sorted(
            (o for o in committed if o.counter_id == counter_id), key=lambda o: o.transaction_id or 0
        )
        value, held = 0, {0}
        for outcome in history:
            assert outcome.value == value + outcome.delta, (
                f"counter {counter_id}: transaction {outcome.transaction_id} answered {outcome.value}, "
                f"but it was {value} before and the change was {outcome.delta:+d} (a lost or doubled update)"
            )
            value = outcome.value
            held.add(value)
        assert value == sum(o.delta for o in history)
        stale = [o for o in refused if o.counter_id == counter_id and o.value not in held]
        assert not stale, f"refusals named values counter {counter_id} never held: {stale}"
        for service in services:
            state = service.read(counter_id)
            if not history:
                assert state is None and service.get(counter_id) == 0
                continue
            assert state is not None and state.value == value, (counter_id, state, value)
            assert state.updated_tx == history[-1].transaction_id, "updated_tx is not the last writer"

    stats = [service.stats() for service in services]
    assert sum(s.lock_failures for s in stats) > 0, "hot counters never failed a lock check"
    assert sum(s.increments + s.decrements for s in stats) == len(committed)
    assert sum(s.refused for s in stats) == len(refused)
    assert all(s.timeouts == 0 for s in stats), stats
    for service in services:
        assert service.callbacks.uncaught_count == 0, list(service.callbacks.uncaught)


# --- the HTTP API -------------------------------------------------------------------------------------


@pytest.fixture
def api(counter_cluster: LocalCluster, tmp_path: Path) -> Iterator[CounterHttpServer]:
    """One counter service on a SQLite file, served on 127.0.0.1 (a free port)."""
    (service,) = start_services(counter_cluster, f"sqlite:///{tmp_path / 'api.db'}", 1)
    try:
        with CounterHttpServer(service, "127.0.0.1", 0) as server:
            yield server
        assert service.callbacks.uncaught_count == 0, list(service.callbacks.uncaught)
    finally:
        service.close()


def call(server: CounterHttpServer, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    """One request; ``body`` is sent as JSON, or as is when it is bytes."""
    connection = http.client.HTTPConnection(server.host, server.port, timeout=TIMEOUT)
    try:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        connection.request(method, path, body=data, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        answer = json.loads(response.read())
        assert isinstance(answer, dict)
        return response.status, answer
    finally:
        connection.close()


def test_http_api_changes_reads_and_refuses(api: CounterHttpServer) -> None:
    counter = random.randrange(1, 1 << 62)
    base = f"/counters/{counter}"

    assert call(api, "GET", base) == (200, {"counter_id": counter, "value": 0})
    status, answer = call(api, "POST", f"{base}/increment", {"amount": 10})
    assert status == 200 and answer["counter_id"] == counter and answer["value"] == 10
    first_tx = answer["transaction_id"]
    assert isinstance(first_tx, int) and first_tx >= 0
    status, answer = call(api, "POST", f"{base}/decrement", {"amount": 4})
    assert status == 200 and answer["value"] == 6 and answer["transaction_id"] > first_tx
    assert call(api, "GET", base) == (200, {"counter_id": counter, "value": 6})
    assert call(api, "GET", f"{base}?consistent=true") == (200, {"counter_id": counter, "value": 6})

    status, answer = call(api, "POST", f"{base}/decrement", {"amount": 7})
    assert status == 409
    assert (answer["value"], answer["requested"]) == (6, 7)
    assert "never goes negative" in answer["error"]
    assert call(api, "GET", base)[1]["value"] == 6, "a refused decrement changed the counter"
    status, answer = call(api, "POST", f"/counters/{counter + 1}/decrement", {"amount": 1})
    assert (status, answer["value"]) == (409, 0), "a counter never written holds 0"

    bad_requests: list[tuple[str, Any, str]] = [
        (f"{base}/increment", {"amount": 0}, "amount must be an integer in 1.."),
        (f"{base}/increment", {"amount": -3}, "amount must be an integer in 1.."),
        (f"{base}/increment", {"amount": 1.5}, "amount must be an integer in 1.."),
        (f"{base}/increment", {"amount": "5"}, "amount must be an integer in 1.."),
        (f"{base}/increment", {"amount": True}, "amount must be an integer in 1.."),
        (f"{base}/increment", {"amount": 1 << 63}, "amount must be an integer in 1.."),
        (f"{base}/decrement", {}, "the body has no amount"),
        (f"{base}/decrement", {"amount": 1, "note": "x"}, "unknown fields ['note']"),
        (f"{base}/decrement", [1], "must be a JSON object"),
        (f"{base}/increment", b"{amount: 1", "the body is not JSON"),
        (f"{base}/increment", b'{"amount": ' + b"9" * 4301 + b"}", "the body is not JSON"),  # int limit
        (f"{base}/increment", b"[" * 60000, "the body is not JSON"),  # nested past the recursion limit
        (f"{base}/increment", b'{"amount": 1, "amount": 2}', "duplicate field 'amount'"),
        (f"{base}/increment", None, "the request has no body"),
        ("/counters/abc/increment", {"amount": 1}, "counter ID 'abc' is not an integer"),
        ("/counters/-1/increment", {"amount": 1}, "counter ID '-1' is not an integer"),
        (f"/counters/{1 << 63}/increment", {"amount": 1}, "is not an integer in 0..9223372036854775807"),
    ]
    for path, body, message in bad_requests:
        status, answer = call(api, "POST", path, body)
        assert status == 400 and message in answer["error"], (path, body, status, answer)
    assert call(api, "GET", base)[1]["value"] == 6, "a bad request changed the counter"

    assert call(api, "GET", "/counters/abc")[0] == 400
    # A Content-Length of a digit that is not ASCII ("²" passes str.isdigit) is a bad request.
    connection = http.client.HTTPConnection(api.host, api.port, timeout=TIMEOUT)
    try:
        connection.putrequest("POST", f"{base}/increment")
        connection.putheader("Content-Length", "²")  # one byte, 0xB2, in latin-1
        connection.endheaders()
        response = connection.getresponse()
        assert response.status == 400 and "is not a number of bytes" in json.loads(response.read())["error"]
    finally:
        connection.close()
    status, answer = call(api, "GET", "/nowhere")
    assert status == 404 and "POST /counters/<id>/increment" in answer["error"]
    assert call(api, "GET", f"{base}/increment")[0] == 405
    assert call(api, "POST", base, {"amount": 1})[0] == 405

    status, answer = call(api, "GET", "/health")
    assert status == 200 and answer["healthy"] is True
    assert answer["mounted_partitions"] == [0, 1]
    assert answer["stats"]["increments"] == 1 and answer["stats"]["decrements"] == 1
    assert answer["stats"]["refused"] == 2


def test_a_consistent_read_that_cannot_reach_the_servers_answers_503_in_time(
    waltz_cluster_factory: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    """A cluster of the test's own loses its only server: ``?consistent=true`` cannot ask for the
    partition's high-water mark, and is answered 503 within the request timeout, saying what to
    do, where it was a 500 with a traceback in the log."""
    cluster = waltz_cluster_factory(name="counter-unreachable", partitions=1, servers=1)
    (service,) = start_services(cluster, f"sqlite:///{tmp_path / 'unreachable.db'}", 1)
    service.request_timeout = 2.0
    counter = random.randrange(1, 1 << 62)
    try:
        with CounterHttpServer(service, "127.0.0.1", 0) as server:
            assert call(server, "GET", f"/counters/{counter}?consistent=true")[0] == 200
            cluster.stop_server(0)
            started = time.monotonic()
            status, answer = call(server, "GET", f"/counters/{counter}?consistent=true")
            assert status == 503, answer
            assert "high-water mark" in answer["error"] and "consistent=True" in answer["error"], answer
            assert answer["committed"] is None, answer
            assert time.monotonic() - started < 20, "the request timeout did not bound the answer"
            assert call(server, "GET", f"/counters/{counter}") == (200, {"counter_id": counter, "value": 0})
    finally:
        service.close()


def _post_head(server: CounterHttpServer, body: bytes, length: int) -> socket.socket:
    """A connection that sent an increment's headers with ``Content-Length: length`` and ``body``."""
    connection = socket.create_connection((server.host, server.port), timeout=TIMEOUT)
    connection.sendall(
        b"POST /counters/8/increment HTTP/1.1\r\nHost: counter\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {length}\r\n\r\n".encode()
        + body
    )
    return connection


def _answer(connection: socket.socket) -> tuple[int, dict[str, str], dict[str, Any]]:
    """The status, headers and JSON body of the one answer on ``connection`` (read to its end)."""
    received = b""
    while chunk := connection.recv(65536):
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (h.partition(":") for h in header_lines)}
    return int(status_line.split()[1]), headers, json.loads(body)


def test_a_body_shorter_than_its_content_length_is_answered_and_the_connection_closed(
    counter_cluster: LocalCluster,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A body that stops short of its ``Content-Length`` (a client that stalls, a proxy that cut
    it) is answered 408 once it has paused ``body_timeout`` seconds, and one whose sender closed
    its side 400, each on a connection then closed, where the first waited out the 60-second idle
    timeout and both were answered 500 with tracebacks in the log. Nothing is changed."""
    (service,) = start_services(counter_cluster, f"sqlite:///{tmp_path / 'short.db'}", 1)
    try:
        with CounterHttpServer(service, "127.0.0.1", 0, body_timeout=1.0) as server:
            stalled = _post_head(server, b'{"amount": 1}', 20)
            started = time.monotonic()
            try:
                status, headers, answer = _answer(stalled)
            finally:
                stalled.close()
            assert status == 408 and "13 of the 20 bytes" in answer["error"], (status, answer)
            assert headers["connection"] == "close" and time.monotonic() - started < 10
            cut = _post_head(server, b'{"amount": 1}', 20)
            try:
                cut.shutdown(socket.SHUT_WR)
                status, headers, answer = _answer(cut)
            finally:
                cut.close()
            assert status == 400 and "13 of the 20 bytes" in answer["error"], (status, answer)
            assert headers["connection"] == "close"
            assert call(server, "GET", "/health")[1]["stats"]["increments"] == 0
    finally:
        service.close()
    assert "Traceback" not in capfd.readouterr().err
    errors = [r for r in caplog.records if r.name.startswith("waltz_examples") and r.levelno >= logging.ERROR]
    assert errors == [], errors


def test_load_generator_and_command_report_a_consistent_run(api: CounterHttpServer) -> None:
    first = random.randrange(1, 1 << 62)
    report = run_load(
        api.url, requests=60, concurrency=4, counters=2, decrement_ratio=0.4, first_counter=first, seed=3
    )
    assert report.transport_errors == 0 and report.first_errors == ()
    assert sum(report.statuses.values()) == 60 and set(report.statuses) <= {200, 409}
    assert report.check is not None and report.check.ok, report.describe()
    assert report.check.initial == {first: 0, first + 1: 0}
    assert 0 < report.percentile(50) <= report.percentile(99) <= report.percentile(100)

    result = CliRunner().invoke(
        app,
        [
            *("load", "--url", api.url, "--requests", "20", "--concurrency", "2", "--counters", "2"),
            *("--first-counter", str(first), "--decrement-ratio", "0.5"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "requests/s" in result.output and "consistency   OK" in result.output
    assert "p99" in result.output


def test_command_line_help_lists_the_commands() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0, result.output
    for command in ("serve", "local", "load"):
        assert command in result.output
    result = CliRunner().invoke(app, ["serve", "--help"])
    assert result.exit_code == 0 and "--zookeeper" in result.output and "--root" in result.output


@pytest.mark.parametrize("command", ["serve", "local"])
def test_a_database_the_service_cannot_use_is_refused_in_one_line_before_anything_starts(
    command: str, waltz_postgres_url: str, tmp_path: Path
) -> None:
    """A database that does not exist, or a driver that is not installed: one ``error:`` line
    naming --db and the URL without its password, exit 2, and no cluster started (``local``)."""
    absent = make_url(waltz_postgres_url).set(password="s3cret", database="waltz_test_absent_database")
    cases = {
        absent.render_as_string(hide_password=False): 'database "waltz_test_absent_database" does not exist',
        "mysql+mysqldb://root:s3cret@127.0.0.1/counter": "No module named 'MySQLdb'",
    }
    where = (
        ("--zookeeper", f"127.0.0.1:{free_port()}", "--root", "/waltz/counter") if command == "serve" else ()
    )
    for url, cause in cases.items():
        done = subprocess.run(
            [sys.executable, "-m", "waltz_examples.counter", command, "--db", url, *where, "--port", "0"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=tmp_path,
            env={k: v for k, v in os.environ.items() if not k.startswith(("COUNTER_", "WALTZ_"))},
        )
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: --db "), done.stderr
        assert cause in lines[0] and "s3cret" not in done.stderr and ":***@" in lines[0], done.stderr
        assert "starting a local Waltz cluster" not in done.stdout
