"""OpenTelemetry traces of transactions, when turned on (the optional ``waltz-py[tracing]`` extra).

Design: docs/design/client.md, "Traces" and docs/design/server.md, "Traces". A traced transaction
is one trace: the client's ``waltz.transaction`` span from submit to its outcome (attempts, lock
failures, held-back appends and the commit as its events), the server's ``waltz.server.append``
span per attempt the server accepted (a child across processes: the client sends the W3C
``traceparent`` with the append, ``docs/protocol.md`` "Trace context"), the store's
``waltz.store.write`` span per store batch (its quorum write, linked to each traced append of the
batch) and the client's ``waltz.apply`` span (the application applying it).

This module imports nothing of OpenTelemetry: it is loaded by the client and the server whether
tracing is on or not, and only :func:`client_tracing` and :func:`start_server_tracing` load
:mod:`waltz.tracing._otel` (and with it the SDK), when tracing is turned on. Off, the hooks cost
an attribute check per transaction.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from waltz.errors import ConfigurationError

if TYPE_CHECKING:
    # The types callers annotate with, named here so that no module outside this package imports
    # the private module that loads OpenTelemetry.
    from waltz.tracing._otel import ClientTracing as ClientTracing
    from waltz.tracing._otel import ServerTracing as ServerTracing
    from waltz.tracing._otel import TransactionTrace as TransactionTrace

__all__ = [
    "apply_taken",
    "client_tracing",
    "client_tracing_on",
    "server",
    "start_server_tracing",
    "stop_server_tracing",
    "store_batch",
    "store_record_done",
]

#: True once a client of this process turned tracing on (the apply worker looks for traced
#: transactions only then).
client_tracing_on = False

#: The server's tracing, set by :func:`start_server_tracing` (None: off).
server: ServerTracing | None = None


class _Traced(Protocol):
    """A record of a store batch: its ``trace`` (None when not traced, see :func:`store_batch`)."""

    trace: Any


def _load() -> Any:
    try:
        from waltz.tracing import _otel
    except ImportError as exc:
        raise ConfigurationError(
            f"tracing is on but OpenTelemetry is not installed ({exc}); install waltz-py[tracing] "
            "(opentelemetry-api, opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http) or turn "
            "tracing off"
        ) from exc
    return _otel


def client_tracing(client_id: int, sample_ratio: float) -> ClientTracing:
    """The tracing of a client (``client.tracing`` on).

    Args:
        client_id: the client's ID (a span attribute).
        sample_ratio: the share of transactions traced, 0 to 1 (``client.tracingSampleRatio``).

    Raises:
        ConfigurationError: OpenTelemetry is not installed.
    """
    global client_tracing_on
    tracing: ClientTracing = _load().ClientTracing(client_id, sample_ratio)
    client_tracing_on = True
    return tracing


def start_server_tracing(endpoint: str) -> ServerTracing:
    """Turn the server's tracing on (``server.tracing``) for this process.

    Args:
        endpoint: the server's endpoint (a span attribute).

    Raises:
        ConfigurationError: OpenTelemetry is not installed.
    """
    global server
    server = _load().ServerTracing(endpoint)
    return server


def stop_server_tracing() -> None:
    """Export what the server's tracing holds and turn it off."""
    global server
    if server is not None:
        server.close()
        server = None


def apply_taken(entries: Iterable[Any]) -> None:
    """Note when the apply worker took these ``(transaction, submission)`` entries: the start of
    the ``waltz.apply`` span of each traced submission among them."""
    now = time.time_ns()
    for entry in entries:
        submission = entry[1]
        if submission is not None and submission.trace is not None:
            submission.trace.apply_taken(entry[0].transaction_id, now)


def store_batch(
    records: Iterable[_Traced], partition_id: int, first: int, last: int, replicas: int, queued: int
) -> int:
    """Open the ``waltz.store.write`` span of a store batch (transactions ``first`` to ``last``,
    sent to ``replicas`` replicas) when some of its records are traced, and hand it to each of
    them (their ``trace`` is now the batch's; :func:`store_record_done` ends it).

    Args:
        queued: traced records queued before this batch was taken.

    Returns:
        The traced records still queued (``queued`` less those of this batch).
    """
    traced = [record for record in records if record.trace is not None]
    if traced and server is not None:
        server.store_batch(traced, partition_id, first, last, replicas)
    return max(0, queued - len(traced))


def store_record_done(trace: Any, error: BaseException | None) -> None:
    """A traced record left the store (committed, or failed with ``error``): end its batch's span
    (once) and its server append span's link holder."""
    done = getattr(trace, "done", None)
    if done is not None:
        done(error)
