"""A small JSON HTTP API over :class:`~waltz_examples.counter.service.CounterService` (standard library).

Routes (bodies and answers are JSON objects; errors are ``{"error": "<what happened and what to
do>"}``):

===========================================  ===============================================
``POST /counters/<id>/increment``            body ``{"amount": n}``, n a positive integer:
``POST /counters/<id>/decrement``            200 ``{"counter_id", "value", "transaction_id"}``;
                                             409 when a decrement would go negative (the
                                             answer adds ``"value"``, the current value, and
                                             ``"requested"``) or an increment would overflow;
                                             400 for a bad ID, body or amount; 408 for a
                                             body that stops short of its Content-Length
                                             for ``body_timeout`` seconds (400 when its
                                             sender closed its side; the connection is
                                             closed after either).
``GET /counters/<id>[?consistent=true]``     200 ``{"counter_id", "value"}`` (0 for a counter
                                             never written; ``consistent``: see
                                             :meth:`CounterService.get`); with ``consistent``,
                                             503 when the partition's server does not
                                             answer, or this database does not catch up,
                                             within the request timeout.
``GET /health``                              200 or 503 ``{"healthy", "partitions", ...,
                                             "stats"}``.
===========================================  ===============================================

A change that does not complete within the service's request timeout answers 503 with
``"committed"``: true (it will be applied: do not retry), false (safe to retry) or null (unknown:
a retry applies the change twice if the first one commits, and with other writers reading the
counter cannot tell; the counter has no request IDs, see its README). Connections are kept alive
(HTTP/1.1).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self, cast
from urllib.parse import parse_qs, urlsplit

from waltz.errors import ClientClosedError
from waltz_examples.counter.errors import (
    CounterOverflowError,
    CounterRequestTimeoutError,
    InsufficientCountError,
)
from waltz_examples.counter.models import MAX_VALUE
from waltz_examples.counter.service import CounterService

__all__ = ["DEFAULT_BODY_TIMEOUT", "MAX_BODY_BYTES", "CounterHttpServer"]

log = logging.getLogger(__name__)

#: The largest request body accepted, in bytes.
MAX_BODY_BYTES = 64 * 1024
#: Seconds an idle kept-alive connection stays open.
_IDLE_TIMEOUT = 60.0
#: Seconds a request body may pause before it is answered 408 (``CounterHttpServer(body_timeout=)``).
DEFAULT_BODY_TIMEOUT = 10.0

_COUNTER = re.compile(r"^/counters/(?P<id>[^/]+)$")
_CHANGE = re.compile(r"^/counters/(?P<id>[^/]+)/(?P<action>increment|decrement)$")
_DIGITS = re.compile(r"^[0-9]{1,19}$")


class BadRequestError(ValueError):
    """A request the API cannot serve; its message goes to the caller with the status."""

    def __init__(
        self, message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST, *, allow: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.allow = allow


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # listen backlog: many load threads connect at once
    service: CounterService
    body_timeout: float = DEFAULT_BODY_TIMEOUT


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "waltz-counter/1"
    timeout = _IDLE_TIMEOUT
    # The headers and the body go out in two writes: with Nagle's algorithm the body would wait
    # for the client's delayed ACK of the headers (about 40 ms per request on Linux).
    disable_nagle_algorithm = True

    @property
    def service(self) -> CounterService:
        return cast(_Server, self.server).service

    # --- methods ----------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def _handle(self, method: str) -> None:
        headers: dict[str, str] = {}
        try:
            body = self._read_body()
            status, answer = self._route(method, body)
        except BadRequestError as exc:
            status, answer = exc.status, {"error": str(exc)}
            if exc.allow is not None:
                headers["Allow"] = exc.allow
        except InsufficientCountError as exc:
            status = HTTPStatus.CONFLICT
            answer = {
                "error": str(exc),
                "counter_id": exc.counter_id,
                "value": exc.current,
                "requested": exc.requested,
            }
        except CounterOverflowError as exc:
            status = HTTPStatus.CONFLICT
            answer = {"error": str(exc), "counter_id": exc.counter_id, "value": exc.current}
        except CounterRequestTimeoutError as exc:
            status = HTTPStatus.SERVICE_UNAVAILABLE
            answer = {"error": str(exc), "committed": exc.committed, "transaction_id": exc.transaction_id}
        except ClientClosedError as exc:
            status = HTTPStatus.SERVICE_UNAVAILABLE
            answer = {"error": f"the service is shutting down ({exc}); retry on another instance"}
        except Exception as exc:
            log.exception("%s %s failed", method, self.path)
            status = HTTPStatus.INTERNAL_SERVER_ERROR
            # The exception's text stays in the service's log: it may hold paths, SQL or data.
            answer = {"error": f"internal error ({type(exc).__name__}); see the service's log"}
        try:
            self._send(status, answer, headers)
        except OSError as exc:  # the caller went away (a reset while its body was read, say)
            self.close_connection = True
            log.info("%s %s: the answer %d could not be sent (%s)", method, self.path, status, exc)

    def _route(self, method: str, body: bytes | None) -> tuple[HTTPStatus, dict[str, Any]]:
        url = urlsplit(self.path)
        path = url.path
        if path == "/health":
            self._allow(method, "GET")
            healthy, details = self.service.health()
            details = {"healthy": healthy, **details, "stats": dataclasses.asdict(self.service.stats())}
            return (HTTPStatus.OK if healthy else HTTPStatus.SERVICE_UNAVAILABLE), details
        match = _CHANGE.match(path)
        if match is not None:
            self._allow(method, "POST")
            counter_id = _counter_id(match["id"])
            amount = _amount(body)
            delta = amount if match["action"] == "increment" else -amount
            update = self.service.change(counter_id, delta)
            return HTTPStatus.OK, {
                "counter_id": update.counter_id,
                "value": update.value,
                "transaction_id": update.transaction_id,
            }
        match = _COUNTER.match(path)
        if match is not None:
            self._allow(method, "GET")
            counter_id = _counter_id(match["id"])
            consistent = _flag(parse_qs(url.query).get("consistent", []))
            return HTTPStatus.OK, {
                "counter_id": counter_id,
                "value": self.service.get(counter_id, consistent=consistent),
            }
        raise BadRequestError(
            f"no such resource {path!r}: use POST /counters/<id>/increment, POST /counters/<id>/decrement, "
            "GET /counters/<id> or GET /health",
            HTTPStatus.NOT_FOUND,
        )

    # --- helpers ----------------------------------------------------------------------------------

    def _allow(self, method: str, allowed: str) -> None:
        if method != allowed:
            raise BadRequestError(
                f"{method} is not allowed on {urlsplit(self.path).path}: use {allowed}",
                HTTPStatus.METHOD_NOT_ALLOWED,
                allow=allowed,
            )

    def _read_body(self) -> bytes | None:
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            if self.headers.get("Transfer-Encoding"):
                self.close_connection = True
                raise BadRequestError(
                    "chunked request bodies are not supported: send a Content-Length",
                    HTTPStatus.LENGTH_REQUIRED,
                )
            return None
        if not (length_header.strip().isascii() and length_header.strip().isdigit()):  # not "²"
            self.close_connection = True
            raise BadRequestError(f"Content-Length {length_header!r} is not a number of bytes")
        length = int(length_header)
        if length > MAX_BODY_BYTES:
            self.close_connection = True  # the body is not read: the connection cannot be reused
            raise BadRequestError(
                f"the request body has {length} bytes; at most {MAX_BODY_BYTES} are accepted",
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            )
        return self._read_exactly(length)

    def _read_exactly(self, length: int) -> bytes:
        """The ``length`` bytes of the body. One that stops short (a client that stalls, a proxy
        that cut it) would hold this thread until the idle timeout, and what follows would be read
        as the next request: it is refused, and the connection closed after the answer.

        Raises:
            BadRequestError: 408 when no byte came for the server's ``body_timeout`` seconds;
                400 when the sender closed its side, or the connection failed, before the end.
        """
        body = bytearray()
        timeout = cast(_Server, self.server).body_timeout
        self.connection.settimeout(timeout)
        try:
            while len(body) < length:
                chunk = self.rfile.read1(length - len(body))
                if not chunk:
                    break
                body += chunk
        except TimeoutError:
            self.close_connection = True
            raise BadRequestError(
                f"the request body stopped after {len(body)} of the {length} bytes of its "
                f"Content-Length for {timeout:g}s: send the whole body at once",
                HTTPStatus.REQUEST_TIMEOUT,
            ) from None
        except OSError as exc:
            self.close_connection = True
            raise BadRequestError(
                f"the request body failed after {len(body)} of the {length} bytes of its "
                f"Content-Length ({exc}): send the request again"
            ) from None
        finally:
            self.connection.settimeout(self.timeout)
        if len(body) < length:
            self.close_connection = True
            raise BadRequestError(
                f"the request body ended after {len(body)} of the {length} bytes of its "
                "Content-Length: send the whole body, or the Content-Length of what is sent"
            )
        return bytes(body)

    def _send(self, status: HTTPStatus, answer: dict[str, Any], headers: dict[str, str]) -> None:
        data = json.dumps(answer).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s - " + format, self.address_string(), *args)


def _counter_id(text: str) -> int:
    if not _DIGITS.match(text) or int(text) > MAX_VALUE:
        raise BadRequestError(f"counter ID {text!r} is not an integer in 0..{MAX_VALUE}")
    return int(text)


def _unique_fields(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's fields as a dict; a field given twice is a bad request (not last wins)."""
    fields: dict[str, Any] = {}
    for key, value in pairs:
        if key in fields:
            raise BadRequestError(f"duplicate field {key!r} in the body: give each field once")
        fields[key] = value
    return fields


def _amount(body: bytes | None) -> int:
    example = 'send {"amount": 5} with Content-Type: application/json'
    if not body:
        raise BadRequestError(f"the request has no body: {example}")
    try:
        document = json.loads(body, object_pairs_hook=_unique_fields)
    except BadRequestError:
        raise
    except RecursionError:
        raise BadRequestError(f"the body is not JSON we read (nested too deeply): {example}") from None
    except ValueError as exc:  # not UTF-8, not JSON, an integer of more than 4300 digits
        raise BadRequestError(f"the body is not JSON ({exc}): {example}") from None
    if not isinstance(document, dict):
        raise BadRequestError(f"the body must be a JSON object, not {type(document).__name__}: {example}")
    unknown = sorted(set(document) - {"amount"})
    if unknown:
        raise BadRequestError(f"unknown fields {unknown}: {example}")
    if "amount" not in document:
        raise BadRequestError(f"the body has no amount: {example}")
    amount = document["amount"]
    if isinstance(amount, bool) or not isinstance(amount, int) or not 1 <= amount <= MAX_VALUE:
        raise BadRequestError(f"amount must be an integer in 1..{MAX_VALUE}, got {json.dumps(amount)}")
    return amount


def _flag(values: list[str]) -> bool:
    if not values:
        return False
    value = values[-1].lower()
    if value in ("", "1", "true", "yes"):
        return True
    if value in ("0", "false", "no"):
        return False
    raise BadRequestError(f"consistent={values[-1]!r}: use true or false")


class CounterHttpServer:
    """Serves the counter API on a background thread (one thread per connection).

    Args:
        service: the counter service to expose (not closed by :meth:`close`).
        host: the address to bind.
        port: the port to bind (0: a free port; see :attr:`port`).
        body_timeout: seconds a request body may pause before the request is answered 408 and
            its connection closed (a body shorter than its ``Content-Length``).

    Raises:
        OSError: the address cannot be bound.
        ValueError: ``body_timeout`` is not a positive finite number.
    """

    def __init__(
        self,
        service: CounterService,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        body_timeout: float = DEFAULT_BODY_TIMEOUT,
    ) -> None:
        if not (isinstance(body_timeout, (int, float)) and math.isfinite(body_timeout) and body_timeout > 0):
            raise ValueError(f"body_timeout must be positive finite seconds, got {body_timeout!r}")
        self._server = _Server((host, port), _Handler)
        self._server.service = service
        self._server.body_timeout = float(body_timeout)
        self.host = host
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=f"counter-http-{self.port}", daemon=True
        )
        self._started = False
        self._closed = False

    @property
    def url(self) -> str:
        """The base URL, e.g. ``http://127.0.0.1:8080``."""
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        """Start serving (returns at once)."""
        if self._closed:
            raise RuntimeError("the counter HTTP server is closed; create a new one")
        if not self._started:
            self._started = True
            self._thread.start()
            log.info("counter API listening on %s", self.url)

    def close(self) -> None:
        """Stop accepting requests and release the port. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._started:
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
