"""The spans of transactions, on OpenTelemetry (loaded only when tracing is on).

Design: docs/design/client.md, "Traces" and docs/design/server.md, "Traces". Span names and
attributes are listed in docs/tracing.md; why the store's span is one per batch is
docs/decisions/0035-opentelemetry-traces.md.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

if TYPE_CHECKING:
    from waltz.protocol.records import ReqId

__all__ = ["ClientTracing", "ServerTracing", "StoreBatchTrace", "TransactionTrace", "parse_traceparent"]

log = logging.getLogger(__name__)

#: The instrumentation scope of every Waltz span.
SCOPE = "waltz"


def _provider(service_name: str) -> tuple[trace.TracerProvider, TracerProvider | None]:
    """The provider spans go to: the application's own SDK provider when it installed one, else a
    provider of ours exporting over OTLP/HTTP in batches (returned second, to shut down at the end).

    Ours follows the standard ``OTEL_*`` variables: ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) and headers, ``OTEL_SERVICE_NAME`` and
    ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER`` (parent-based always-on by default),
    ``OTEL_BSP_*`` for the batch span processor.
    """
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return current, None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    provider = TracerProvider(resource=Resource.create(_default_attributes(service_name)))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider, provider


def _default_attributes(service_name: str) -> dict[str, str]:
    """The resource attributes our provider adds to what the ``OTEL_*`` variables say: the
    ``service.name`` ``service_name``, only when neither ``OTEL_SERVICE_NAME`` nor a
    ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES`` names the service (docs/tracing.md,
    "Turning it on"); read by the SDK's own parser of those variables."""
    if SERVICE_NAME in OTELResourceDetector().detect().attributes:
        return {}
    return {SERVICE_NAME: service_name}


def parse_traceparent(traceparent: str) -> SpanContext | None:
    """The remote span context of a W3C ``traceparent`` (version 00), or None when malformed."""
    if len(traceparent) != 55 or traceparent[2] != "-" or traceparent[35] != "-" or traceparent[52] != "-":
        return None
    try:
        trace_id = int(traceparent[3:35], 16)
        span_id = int(traceparent[36:52], 16)
        flags = int(traceparent[53:55], 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags))


class ClientTracing:
    """A client's tracing: starts a traced transaction for the sampled share of submissions.

    Args:
        client_id: the client's ID (the ``waltz.client_id`` attribute).
        sample_ratio: the share of transactions traced (0 to 1); decided before any span is made,
            so that a transaction not traced costs one random number.
    """

    def __init__(self, client_id: int, sample_ratio: float) -> None:
        self.client_id = client_id
        self.sample_ratio = sample_ratio
        provider, self._owned = _provider("waltz-client")
        self.tracer = provider.get_tracer(SCOPE)

    def begin(self, partition_id: int, context: object) -> TransactionTrace | None:
        """The trace of a new submission, or None when this one is not traced (sampled out by
        the ratio or by the provider's sampler). Its parent is the caller's current span, if any."""
        ratio = self.sample_ratio
        if ratio < 1.0 and random.random() >= ratio:
            return None
        span = self.tracer.start_span(
            "waltz.transaction",
            kind=SpanKind.CLIENT,
            attributes={
                "waltz.client_id": self.client_id,
                "waltz.partition_id": partition_id,
                "waltz.context": type(context).__name__,
            },
        )
        if not span.is_recording():
            return None
        return TransactionTrace(self.tracer, span)

    def close(self) -> None:
        """Export what is left (of a provider of our own) and stop."""
        if self._owned is not None:
            self._owned.shutdown()


class TransactionTrace:
    """The root span of one submitted transaction and what hangs from it (client side).

    Attributes:
        span: the ``waltz.transaction`` span.
        traceparent: its W3C ``traceparent``, sent with each append of the transaction.
        apply_start: when the apply worker took the committed transaction (ns since the epoch;
            0 until then).
    """

    __slots__ = ("_ended", "apply_start", "span", "traceparent", "tracer", "transaction_id")

    def __init__(self, tracer: trace.Tracer, span: trace.Span) -> None:
        self.tracer = tracer
        self.span = span
        context = span.get_span_context()
        self.traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
        self.apply_start = 0
        self.transaction_id = -1
        self._ended = False

    def attempt(self, number: int, client_high_water_mark: int) -> None:
        """An attempt starts (``execute`` runs at this client high-water mark)."""
        self.span.add_event(
            "attempt", {"waltz.attempt": number, "waltz.client_high_water_mark": client_high_water_mark}
        )

    def retry(self, lock_target: int | None) -> None:
        """The last attempt failed: a lock failure naming ``lock_target``, or lost (None)."""
        if lock_target is None:
            self.span.add_event("append lost")
        else:
            self.span.add_event("lock failure", {"waltz.lock_failure.transaction_id": lock_target})

    def held(self) -> None:
        """The attempt's append is held back behind a pending append of this client that holds
        one of its locks (``client.holdConflictingAppends``)."""
        self.span.add_event("append held back")

    def committed(self, transaction_id: int | None) -> None:
        """The transaction committed as ``transaction_id`` (seen in the feed), or ``execute``
        dropped it (None): the root span ends."""
        span = self.span
        if transaction_id is None:
            span.set_attribute("waltz.outcome", "dropped")
        else:
            self.transaction_id = transaction_id
            span.set_attribute("waltz.outcome", "committed")
            span.set_attribute("waltz.transaction_id", transaction_id)
            span.add_event("committed", {"waltz.transaction_id": transaction_id})
        self._end()

    def failed(self, error: BaseException, outcome: str = "failed") -> None:
        """The transaction ended without committing (an error, or expired)."""
        span = self.span
        span.set_attribute("waltz.outcome", outcome)
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        self._end()

    def _end(self) -> None:
        if not self._ended:
            self._ended = True
            self.span.end()

    def apply_taken(self, transaction_id: int, now: int) -> None:
        """The apply worker took the committed transaction ``transaction_id`` at ``now`` (ns since
        the epoch), maybe before the completion thread saw its commit."""
        self.transaction_id = transaction_id
        self.apply_start = now

    def applied(self) -> None:
        """This client's application applied the transaction: the ``waltz.apply`` span, from when
        the apply worker took it to now."""
        now = time.time_ns()
        span = self.tracer.start_span(
            "waltz.apply",
            context=trace.set_span_in_context(self.span),
            attributes={"waltz.transaction_id": self.transaction_id},
            start_time=self.apply_start or now,
        )
        span.end(now)


class ServerTracing:
    """A server process's tracing: the spans of traced appends and of their store batches.

    Args:
        endpoint: the server's endpoint (the ``waltz.server`` attribute).
    """

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        provider, self._owned = _provider("waltz-server")
        self.tracer = provider.get_tracer(SCOPE)

    def append_started(self, traceparent: str, req_id: ReqId, client_high_water_mark: int) -> Any:
        """The ``waltz.server.append`` span of an append the server accepted (a child of the
        client's span ``traceparent`` names), or None when it is malformed or not sampled."""
        parent = parse_traceparent(traceparent)
        if parent is None:
            return None
        span = self.tracer.start_span(
            "waltz.server.append",
            context=trace.set_span_in_context(NonRecordingSpan(parent)),
            kind=SpanKind.SERVER,
            attributes={
                "waltz.server": self.endpoint,
                "waltz.partition_id": req_id.partition_id,
                "waltz.client_id": req_id.client_id,
                "waltz.seq_num": req_id.seq_num,
                "waltz.client_high_water_mark": client_high_water_mark,
            },
        )
        return span if span.is_recording() else None

    @staticmethod
    def append_resolved(span: Any, transaction_id: int | None) -> None:
        """The append left the store: committed as ``transaction_id`` (its quorum write done),
        or failed (None)."""
        if transaction_id is None:
            span.set_status(Status(StatusCode.ERROR, "not committed"))
        else:
            span.set_attribute("waltz.transaction_id", transaction_id)
        span.end()

    def store_batch(
        self, traced: Sequence[Any], partition_id: int, first: int, last: int, replicas: int
    ) -> None:
        """Open the ``waltz.store.write`` span of a store batch whose ``traced`` records (their
        ``trace`` a server append span, at least one) are traced: a child of the first, linked to
        each; each record's ``trace`` becomes the batch's :class:`StoreBatchTrace`, and each
        other append span links back to it."""
        spans = [record.trace for record in traced if isinstance(record.trace, trace.Span)]
        if not spans:
            return
        batch = self.tracer.start_span(
            "waltz.store.write",
            context=trace.set_span_in_context(spans[0]),
            links=[Link(span.get_span_context()) for span in spans],
            attributes={
                "waltz.partition_id": partition_id,
                "waltz.store.first_transaction_id": first,
                "waltz.store.last_transaction_id": last,
                "waltz.store.records": last - first + 1,
                "waltz.store.replicas": replicas,
            },
        )
        handle = StoreBatchTrace(batch)
        batch_context = batch.get_span_context()
        for span in spans:
            if span is not spans[0]:
                span.add_link(batch_context)
        for record in traced:
            record.trace = handle

    def close(self) -> None:
        """Export what is left (of a provider of our own) and stop."""
        if self._owned is not None:
            self._owned.shutdown()


class StoreBatchTrace:
    """The ``waltz.store.write`` span of one store batch, ended when its first traced record
    resolves (a batch commits, or fails, as a whole)."""

    __slots__ = ("_lock", "span")

    def __init__(self, span: trace.Span) -> None:
        self.span: trace.Span | None = span
        self._lock = threading.Lock()

    def done(self, error: BaseException | None) -> None:
        with self._lock:
            span, self.span = self.span, None
        if span is not None:
            if error is not None:
                span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            span.end()
