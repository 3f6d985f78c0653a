"""OpenTelemetry traces of transactions across the client, the server and the store (docs/tracing.md).

A local cluster whose server exports its spans over OTLP/HTTP, as in production, to a receiver
this module runs (the standard library's HTTP server decoding the OTLP protobuf); the client's
spans go to the SDK's in-memory exporter. With tracing off, nothing of OpenTelemetry is loaded.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the waltz-py[tracing] extra is not installed")

from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.client.client_helpers import Append, MemoryStore
from waltz import PartitionLocalLock, TransactionBuilder, WaltzClient, WaltzClientConfig
from waltz.local.cluster import LocalCluster
from waltz.local.options import ProcessOptions
from waltz.tracing._otel import parse_traceparent

ROOT = Path(__file__).resolve().parents[2]


class OtlpReceiver:
    """An OTLP/HTTP trace receiver on loopback: keeps every span posted to ``/v1/traces``."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                with receiver._lock:
                    for resource in request.resource_spans:
                        for scope in resource.scope_spans:
                            receiver.spans.extend(scope.spans)
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def find(self, name: str, trace_id: int, count: int = 1, timeout: float = 30.0) -> list[Any]:
        """The spans named ``name`` of trace ``trace_id``, once ``count`` of them arrived."""
        deadline = time.monotonic() + timeout
        wanted = trace_id.to_bytes(16, "big")
        while True:
            with self._lock:
                found = [s for s in self.spans if s.name == name and s.trace_id == wanted]
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.05)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    server = OtlpReceiver()
    yield server
    server.close()


@pytest.fixture(scope="module")
def traced_cluster(
    tmp_path_factory: pytest.TempPathFactory, zookeeper: Any, receiver: OtlpReceiver
) -> Iterator[LocalCluster]:
    """One storage node and one server with tracing on, exporting to ``receiver`` in batches."""
    env = {
        "WALTZ_SERVER_TRACING": "true",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_SERVICE_NAME": "waltz-server-under-test",
    }
    with LocalCluster(
        storages=1,
        servers=1,
        partitions=1,
        name="tracing",
        zookeeper=zookeeper.connect_string,
        work_dir=tmp_path_factory.mktemp("tracing-cluster"),
        delete_root=True,
        processes=ProcessOptions(server_env=env),
    ) as local:
        yield local


@pytest.fixture(scope="module")
def client_spans() -> InMemorySpanExporter:
    """The client's spans: the process's tracer provider (installed here once) keeps them."""
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


def _config(cluster: LocalCluster, **settings: Any) -> WaltzClientConfig:
    return WaltzClientConfig(**cluster.client_settings(), **settings)


def _wait_for(spans: InMemorySpanExporter, found: Callable[[list[ReadableSpan]], bool]) -> list[ReadableSpan]:
    deadline = time.monotonic() + 30
    while True:
        finished = list(spans.get_finished_spans())
        if found(finished) or time.monotonic() > deadline:
            return finished
        time.sleep(0.02)


def _transaction_of(span: ReadableSpan) -> object:
    return (span.attributes or {}).get("waltz.transaction_id")


def _root_of(finished: list[ReadableSpan], transaction_id: int) -> ReadableSpan:
    roots = [s for s in finished if s.name == "waltz.transaction" and _transaction_of(s) == transaction_id]
    assert len(roots) == 1, [s.name for s in finished]
    return roots[0]


def test_a_traced_transaction_is_one_trace_from_submit_to_apply(
    traced_cluster: LocalCluster, receiver: OtlpReceiver, client_spans: InMemorySpanExporter
) -> None:
    start = {pid: owner.high_water_mark for pid, owner in traced_cluster.wait_ready(30).items()}
    store = MemoryStore(start)
    with WaltzClient(store, _config(traced_cluster, client_tracing=True)) as client:
        transaction_id = client.submit(Append(0, b"traced")).result(30).transaction_id
        assert transaction_id is not None
        assert client.wait_applied(0, transaction_id, 30)
        finished = _wait_for(
            client_spans,
            lambda spans: any(
                s.name == "waltz.apply" and (s.attributes or {}).get("waltz.transaction_id") == transaction_id
                for s in spans
            ),
        )
    root = _root_of(finished, transaction_id)
    context = root.context
    assert context is not None
    assert root.parent is None
    assert [e.name for e in root.events] == ["attempt", "committed"]
    assert root.attributes is not None and root.attributes["waltz.outcome"] == "committed"
    [apply] = [
        s
        for s in finished
        if s.name == "waltz.apply" and (s.attributes or {}).get("waltz.transaction_id") == transaction_id
    ]
    assert apply.parent is not None and apply.parent.span_id == context.span_id
    assert apply.context is not None and apply.context.trace_id == context.trace_id

    # The server's span is a child of the client's, across processes; the store's a child of it.
    [append] = receiver.find("waltz.server.append", context.trace_id)
    assert append.parent_span_id == context.span_id.to_bytes(8, "big")
    attributes = {a.key: a.value for a in append.attributes}
    assert attributes["waltz.transaction_id"].int_value == transaction_id
    [write] = receiver.find("waltz.store.write", context.trace_id)
    assert write.parent_span_id == append.span_id
    assert [link.span_id for link in write.links] == [append.span_id]
    batch = {a.key: a.value.int_value for a in write.attributes}
    first, last = batch["waltz.store.first_transaction_id"], batch["waltz.store.last_transaction_id"]
    assert first <= transaction_id <= last
    # The quorum write ends within the server's append span, which ends when it commits.
    assert append.start_time_unix_nano <= write.start_time_unix_nano
    assert write.end_time_unix_nano <= append.end_time_unix_nano


class StaleFirstAttempt(Append):
    """Writes ``lock`` from a stale client high-water mark first (a lock failure if the lock was
    written since), then from the store's mark."""

    sets_client_high_water_mark = True

    def __init__(self, store: MemoryStore, stale_mark: int, lock: PartitionLocalLock) -> None:
        super().__init__(0, b"second", write_lock=lock)
        self.store = store
        self.stale_mark = stale_mark

    def execute(self, builder: TransactionBuilder) -> bool:
        first = self.outcomes.executions == 0
        super().execute(builder)
        builder.set_client_high_water_mark(self.stale_mark if first else self.store.snapshot(0)[0])
        return True


def test_a_lock_failure_is_an_event_before_the_second_attempt(
    traced_cluster: LocalCluster, receiver: OtlpReceiver, client_spans: InMemorySpanExporter
) -> None:
    start = {pid: owner.high_water_mark for pid, owner in traced_cluster.wait_ready(30).items()}
    store = MemoryStore(start)
    lock = PartitionLocalLock("account", 42)
    with WaltzClient(store, _config(traced_cluster, client_tracing=True)) as client:
        writer = client.submit(Append(0, b"first", write_lock=lock)).result(30).transaction_id
        assert writer is not None
        context = StaleFirstAttempt(store, start[0], lock)
        transaction_id = client.submit(context).result(30).transaction_id
        assert transaction_id is not None
        assert context.outcomes.lock_failures == 1
        finished = _wait_for(
            client_spans,
            lambda spans: any(_transaction_of(s) == transaction_id for s in spans),
        )
    root = _root_of(finished, transaction_id)
    events = [(e.name, dict(e.attributes or {})) for e in root.events]
    assert [name for name, _ in events] == ["attempt", "lock failure", "attempt", "committed"]
    assert events[0][1]["waltz.attempt"] == 1
    assert events[1][1]["waltz.lock_failure.transaction_id"] == writer
    assert events[2][1]["waltz.attempt"] == 2
    # Only the attempt the server accepted has a server span (the refused one is the event above).
    assert root.context is not None
    appends = receiver.find("waltz.server.append", root.context.trace_id)
    assert len(appends) == 1
    marks = {a.key: a.value.int_value for a in appends[0].attributes}
    assert marks["waltz.client_high_water_mark"] >= writer


class ReadsTheStore(Append):
    """Writes ``lock`` from the store's client high-water mark at each attempt."""

    sets_client_high_water_mark = True

    def __init__(self, store: MemoryStore, lock: PartitionLocalLock) -> None:
        super().__init__(0, b"follower", write_lock=lock)
        self.store = store

    def execute(self, builder: TransactionBuilder) -> bool:
        super().execute(builder)
        builder.set_client_high_water_mark(self.store.snapshot(0)[0])
        return True


def test_an_append_held_behind_the_clients_own_is_an_event(
    traced_cluster: LocalCluster, client_spans: InMemorySpanExporter
) -> None:
    """The second of two writers of a lock, submitted while the first is in flight, is held back
    and then fails on the first's commit, found by the client (docs/protocol.md "Append")."""
    start = {pid: owner.high_water_mark for pid, owner in traced_cluster.wait_ready(30).items()}
    store = MemoryStore(start)
    lock = PartitionLocalLock("account", 7)
    with WaltzClient(store, _config(traced_cluster, client_tracing=True)) as client:
        first = client.submit(ReadsTheStore(store, lock))
        second = client.submit(ReadsTheStore(store, lock))
        holder, transaction_id = first.result(30).transaction_id, second.result(30).transaction_id
        assert holder is not None and transaction_id is not None
        finished = _wait_for(
            client_spans, lambda spans: any(_transaction_of(s) == transaction_id for s in spans)
        )
    events = [(e.name, dict(e.attributes or {})) for e in _root_of(finished, transaction_id).events]
    assert [name for name, _ in events] == [
        "attempt",
        "append held back",
        "lock failure",
        "attempt",
        "committed",
    ]
    assert events[2][1]["waltz.lock_failure.transaction_id"] == holder


def test_a_client_samples_the_share_of_transactions_it_is_told(
    traced_cluster: LocalCluster, client_spans: InMemorySpanExporter
) -> None:
    start = {pid: owner.high_water_mark for pid, owner in traced_cluster.wait_ready(30).items()}
    config = _config(traced_cluster, client_tracing=True, client_tracing_sample_ratio=0.0)
    with WaltzClient(MemoryStore(start), config) as client:
        futures = [client.submit(Append(0, b"unsampled")) for _ in range(20)]
        ids = {future.result(30).transaction_id for future in futures}
        client_id = client.client_id
    traced = [
        s
        for s in client_spans.get_finished_spans()
        if (s.attributes or {}).get("waltz.client_id") == client_id
        or (s.attributes or {}).get("waltz.transaction_id") in ids
    ]
    assert traced == []


def test_with_tracing_off_nothing_of_opentelemetry_is_loaded(traced_cluster: LocalCluster) -> None:
    """In a fresh process: a client commits and applies a transaction, the server's modules load."""
    start = traced_cluster.wait_ready(30)[0].high_water_mark
    settings = {name: str(value) for name, value in traced_cluster.client_settings().items()}
    script = textwrap.dedent(
        f"""
        import sys
        from tests.client.client_helpers import Append, MemoryStore
        from waltz import WaltzClient, WaltzClientConfig
        import waltz.services.server.app

        config = WaltzClientConfig(**{settings!r})
        store = MemoryStore({{0: {start}}})
        with WaltzClient(store, config) as client:
            transaction_id = client.submit(Append(0, b"untraced")).result(30).transaction_id
            assert client.wait_applied(0, transaction_id, 30)
        print(sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry"))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize(
    ("traceparent", "valid"),
    [
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", True),
        ("00-00000000000000000000000000000000-b7ad6b7169203331-01", False),
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331", False),
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333x-01", False),
    ],
)
def test_a_server_reads_only_well_formed_trace_contexts(traceparent: str, valid: bool) -> None:
    context = parse_traceparent(traceparent)
    assert (context is not None) == valid
    if context is not None:
        assert context.is_remote and context.trace_flags.sampled


@pytest.mark.parametrize(
    ("variables", "service"),
    [
        ({}, "waltz-client"),
        ({"OTEL_SERVICE_NAME": "billing"}, "billing"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod,service.name=billing"}, "billing"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod"}, "waltz-client"),
    ],
)
def test_the_service_name_of_the_standard_variables_wins_over_the_default(
    variables: dict[str, str], service: str
) -> None:
    """In a fresh process (no tracer provider installed): the provider a client makes names the
    service as ``OTEL_SERVICE_NAME`` or ``OTEL_RESOURCE_ATTRIBUTES`` say, else ``waltz-client``."""
    script = textwrap.dedent(
        """
        from waltz.tracing._otel import _provider

        provider, owned = _provider("waltz-client")
        print(provider.resource.attributes["service.name"])
        owned.shutdown()
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES")}
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**env, **variables, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == service
