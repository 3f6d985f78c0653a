"""The console's web application: Starlette routes, Jinja2 pages, htmx fragments, chart data.

Design: docs/design/console.md "Pages and endpoints", "Operator actions". :func:`create_app`
builds the application; nothing connects until it starts (its lifespan opens the ZooKeeper
session, the HTTP client of the scrapes and the :class:`~waltz.console.observer.Observer`).

Read-only routes (always): ``GET /`` (the page), ``GET /fragments/map`` and
``GET /fragments/metrics`` (what htmx swaps in every refresh), ``GET /api/map.json`` and
``GET /api/charts.json``, ``GET /static/...``. Only with ``operator=True`` does the application
have any other route: ``POST /actions/confirm`` (renders a confirmation, changes nothing) and
``POST /actions/run`` (runs a confirmed action). Who may read and act is
:class:`~waltz.console.access.ConsoleAccess`'s rule (docs/design/console.md "Access"); every
action asked for, run or refused is logged on the ``waltz.console.audit`` logger with who asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from waltz import __version__
from waltz.admin.cluster_admin import ClusterAdmin
from waltz.console.access import AccessMode, ConsoleAccess, Requester
from waltz.console.actions import Action, ActionKind, Confirmations, run_action
from waltz.console.config import LOOPBACK_HOSTS, ConsoleConfig
from waltz.console.metrics import MetricsHistory, client_ssl_context
from waltz.console.observer import Observer
from waltz.errors import ConfigurationError, WaltzError
from waltz.metadata.replicas import ReplicaChangeRefusedError

__all__ = ["PACKAGE_DIR", "connect_admin", "create_app"]

log = logging.getLogger(__name__)
#: Who asked for which action, with its parameters and outcome (INFO; refusals at WARNING).
audit = logging.getLogger("waltz.console.audit")

#: Where the templates and the static files are (installed as package data).
PACKAGE_DIR = Path(__file__).resolve().parent
#: Bytes of an action form read at most.
MAX_FORM_BYTES = 4096
#: Characters that could start a new line, or hide one, in a log line.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def escape_control(text: str) -> str:
    """``text`` with its control characters written as escapes (``\\n``, ``\\x1b``), so that it
    fits in one log line and cannot start a forged one."""
    return _CONTROL.sub(lambda found: repr(found.group())[1:-1], text)


class _OneLine(logging.Filter):
    """Write every record of the audit logger on one line: whatever a request carried (a form
    field, a path, a certificate's subject) cannot start a line that looks like another record."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        escaped = escape_control(message)
        if escaped != message or record.args:
            record.msg, record.args = escaped, None
        return True


audit.addFilter(_OneLine())


class FormTooLargeError(WaltzError):
    """An action's form is larger than :data:`MAX_FORM_BYTES` (answered 413).

    Args:
        declared: the request's Content-Length when it declared too much, else None.
    """

    def __init__(self, declared: str | None) -> None:
        said = f" (Content-Length {declared[:20]})" if declared else ""
        super().__init__(
            f"the form is larger than {MAX_FORM_BYTES} bytes{said}: an action's form is a few short "
            "fields; post it from the console's page"
        )


#: Sent with every response: scripts and styles from the console only, no framing.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class _SecurityHeaders(BaseHTTPMiddleware):
    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        response = await call_next(request)
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response


class _ReadAccess(BaseHTTPMiddleware):
    """403 for a request whose browser certificate may not read the console (certificate mode).

    The static files (the page's libraries, no cluster data) are served to every peer the TLS
    handshake let in; the actions check their own, stricter, roles."""

    def __init__(self, app: Any, access: ConsoleAccess) -> None:
        super().__init__(app)
        self.access = access

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if not request.url.path.startswith(("/static/", "/actions/")):
            requester = self.access.requester(request.scope, request.headers, {})
            refused = self.access.read_denial(requester)
            if refused is not None:
                audit.warning(
                    "console: %s %s by %s refused: %s",
                    request.method,
                    request.url.path,
                    requester.describe(),
                    refused,
                )
                return PlainTextResponse(refused + "\n", status_code=403)
        return await call_next(request)


def _format_age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 60:
        return f"{seconds:.0f}s ago"
    return f"{seconds / 60:.0f} min ago"


def _rate(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:,.0f}" if value >= 10 else f"{value:.1f}"


def connect_admin(config: ConsoleConfig) -> ClusterAdmin:
    """Open the console's ZooKeeper session (blocking): a cluster admin the caller owns.

    Raises:
        ConfigurationError: the connect string or the cluster root is missing or malformed.
        ZooKeeperUnavailableError: no ZooKeeper server answered in time.
        MetadataError: the root is not an absolute znode path.
    """
    connect_string, root = config.require()
    return ClusterAdmin.connect(
        connect_string,
        root,
        connect_timeout=config.zookeeper_connect_timeout,
        session_timeout=config.zookeeper_session_timeout,
        storage_timeout=config.cluster_storage_timeout,
        tls=config.tls(),
        security=config.zookeeper_security(),
    )


def create_app(
    config: ConsoleConfig, admin: ClusterAdmin | None = None, access: ConsoleAccess | None = None
) -> Starlette:
    """Build the console's application (nothing connects before it starts).

    Args:
        config: the console's settings; ``console_operator`` adds the operator routes.
        admin: a connected cluster admin the caller owns (:func:`connect_admin`); None: the
            application connects when it starts and closes the session when it stops.
        access: who may read and act (docs/design/console.md "Access"); None: browser
            certificates with roles when ``console_ssl_ca_file`` is set, else a new start token
            that nobody is shown (give the rule whose :meth:`ConsoleAccess.start_url` is printed).

    Returns:
        The ASGI application, for uvicorn (:func:`waltz.console.server.serve`) or a test client.

    Raises:
        ConfigurationError: the metrics targets are malformed, the ZooKeeper connect string or
            the cluster root is missing, or the cluster's TLS files (``cluster.ssl.*``, which the
            scrapes of ``https`` targets use) are missing or not PEM.
    """
    config.require()
    targets = config.metrics_targets()
    tls = config.tls()
    try:
        scrape_context = client_ssl_context(
            str(tls.ca_file) if tls and tls.ca_file else None,
            str(tls.cert_file) if tls and tls.cert_file else None,
            str(tls.key_file) if tls and tls.key_file else None,
        )
    except (OSError, ValueError) as exc:
        raise ConfigurationError(
            f"the cluster's TLS files are unusable ({exc}): set cluster.ssl.caFile, cluster.ssl.certFile "
            "and cluster.ssl.keyFile (WALTZ_CLUSTER_SSL_*) to PEM files the console can read"
        ) from exc
    operator = config.console_operator
    rule = access or ConsoleAccess.for_browser_ca(config.console_ssl_ca_file is not None)
    templates = Jinja2Templates(directory=str(PACKAGE_DIR / "templates"))
    templates.env.filters["age"] = _format_age
    templates.env.filters["rate"] = _rate
    templates.env.globals.update(
        version=__version__,
        operator=operator,
        refresh=config.console_refresh,
        charts=MetricsHistory.CHARTS,
        access_mode=rule.mode.value,
    )
    confirmations = Confirmations()
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        connect_string, _ = config.require()
        owned = await asyncio.to_thread(connect_admin, config) if admin is None else None
        cluster_admin = owned if owned is not None else admin
        assert cluster_admin is not None
        try:
            async with httpx.AsyncClient(
                verify=scrape_context if scrape_context is not None else True
            ) as http:
                observer = Observer(cluster_admin, connect_string, targets, config.console_refresh, http)
                state["observer"] = observer
                state["admin"] = cluster_admin
                await observer.look_once()
                task = asyncio.create_task(observer.run(), name="console-observer")
                try:
                    yield
                finally:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        finally:
            state.clear()
            if owned is not None:
                await asyncio.to_thread(owned.close)

    def observer() -> Observer:
        found = state.get("observer")
        if not isinstance(found, Observer):
            raise RuntimeError("the console is not started")
        return found

    def context(request: Request, **extra: Any) -> dict[str, Any]:
        look = observer().look
        now = time.time()
        return {
            "look": look,
            "map": look.map,
            "now": now,
            "age": None if look.map is None else now - look.map.taken_at,
            "targets": look.targets,
            "figures": look.partitions,
            "metrics_configured": bool(targets),
            "actions": rule.allowed_actions(rule.requester(request.scope, request.headers, {})),
            "action_kinds": ActionKind,
            **extra,
        }

    async def index(request: Request) -> Response:
        return templates.TemplateResponse(request, "index.html", context(request))

    async def map_fragment(request: Request) -> Response:
        return templates.TemplateResponse(request, "_map.html", context(request))

    async def metrics_fragment(request: Request) -> Response:
        return templates.TemplateResponse(request, "_metrics.html", context(request))

    async def map_json(request: Request) -> Response:
        look = observer().look
        return JSONResponse(
            {
                "round": look.round,
                "error": look.error,
                "map": None if look.map is None else look.map.to_json(),
                "zookeeper": None if look.zookeeper is None else look.zookeeper.to_json(),
            }
        )

    async def charts_json(request: Request) -> Response:
        return JSONResponse({"charts": observer().history.charts()})

    routes: list[BaseRoute] = [
        Route("/", index, methods=["GET"]),
        Route("/fragments/map", map_fragment, methods=["GET"]),
        Route("/fragments/metrics", metrics_fragment, methods=["GET"]),
        Route("/api/map.json", map_json, methods=["GET"]),
        Route("/api/charts.json", charts_json, methods=["GET"]),
        Mount("/static", StaticFiles(directory=str(PACKAGE_DIR / "static")), name="static"),
    ]
    if operator:

        def result(
            request: Request, message: str, status_code: int, action: Action | None = None
        ) -> Response:
            return templates.TemplateResponse(
                request,
                "_result.html",
                {"ok": status_code == 200, "message": message, "action": action},
                status_code=status_code,
            )

        def foreign(request: Request) -> Response | None:
            """403 for a form posted by a page of another origin (cross-site request forgery, or a
            name made to resolve to this console): browsers send Origin with every POST."""
            origin = request.headers.get("origin")
            if origin is None or urlsplit(origin).netloc == request.url.netloc:
                return None
            message = f"a form from {origin} is not the console's own; refused"
            requester = rule.requester(request.scope, request.headers, {})
            audit.warning(
                "console: POST %s by %s refused: %s", request.url.path, requester.describe(), message
            )
            return result(request, message, 403)

        async def form(request: Request) -> dict[str, str]:
            """The posted form, read at most up to :data:`MAX_FORM_BYTES`: a larger declared
            length is refused before any of the body is read, a longer body as soon as the
            limit is passed.

            Raises:
                FormTooLargeError: the form is larger than the limit.
            """
            declared = request.headers.get("content-length", "")
            if declared and (
                not declared.isascii() or not declared.isdecimal() or int(declared) > MAX_FORM_BYTES
            ):
                raise FormTooLargeError(declared)
            body = bytearray()
            async for chunk in request.stream():
                body += chunk
                if len(body) > MAX_FORM_BYTES:
                    raise FormTooLargeError(None)
            return {k: v[0] for k, v in parse_qs(bytes(body).decode("utf-8", errors="replace")).items()}

        def refusal(request: Request, requester: Requester, what: str, reason: str) -> Response:
            audit.warning("console: %s by %s refused: %s", what, requester.describe(), reason)
            return result(request, reason, 403)

        async def asker(request: Request, what: str) -> tuple[Requester, dict[str, str]] | Response:
            """Who posts and the form posted, or the refusal: a foreign origin (403), a requester
            known without the form who may run no action (403, the body unread), a form too
            large (413), a requester who may run no action (403)."""
            refused = foreign(request)
            if refused is not None:
                return refused
            known = rule.requester(request.scope, request.headers, {})
            if rule.mode is AccessMode.CERTIFICATES or known.token_holder:
                denied = rule.acting_denial(known)
                if denied is not None:
                    return refusal(request, known, what, denied)
            try:
                fields = await form(request)
            except FormTooLargeError as exc:
                audit.warning("console: %s by %s refused: %s", what, known.describe(), exc)
                return result(request, str(exc), 413)
            requester = rule.requester(request.scope, request.headers, fields)
            denied = rule.acting_denial(requester)
            if denied is not None:
                return refusal(request, requester, what, denied)
            return requester, fields

        async def confirm(request: Request) -> Response:
            asked = await asker(request, "asking for an action")
            if isinstance(asked, Response):
                return asked
            requester, fields = asked
            try:
                action = Action.parse(
                    fields.get("kind", ""),
                    fields.get("partition", ""),
                    fields.get("storage", ""),
                    fields.get("source"),
                )
                look = observer().look
                if look.map is None:
                    raise WaltzError("the console has not read the cluster yet: ask again in a few seconds")
                action.check_storage_nodes([n.connect_string for n in look.map.storage_nodes])
                action.check_partition([p.partition_id for p in look.map.partitions])
            except WaltzError as exc:
                audit.warning("console: asking for an action by %s refused: %s", requester.describe(), exc)
                return result(request, str(exc), 422)
            denied = rule.action_denial(requester, action.kind)
            if denied is not None:
                return refusal(request, requester, f"asking for {action.command()}", denied)
            token = confirmations.issue(action, requester.identity)
            audit.info("console: %s asked for by %s", action.command(), requester.describe())
            return templates.TemplateResponse(request, "_confirm.html", {"action": action, "token": token})

        async def run(request: Request) -> Response:
            asked = await asker(request, "running an action")
            if isinstance(asked, Response):
                return asked
            requester, fields = asked
            token = fields.get("token", "")
            pending = confirmations.lookup(token)
            action = confirmations.take(token, requester.identity)
            if action is None:
                if pending is None:
                    what, reason = "running a confirmation", "the confirmation is unknown, used or expired"
                else:
                    what, reason = f"running {pending.command()}", "the confirmation is another requester's"
                audit.warning("console: %s by %s refused: %s", what, requester.describe(), reason)
                return result(request, f"Not run: {reason}; ask again.", 409)
            denied = rule.action_denial(requester, action.kind)
            if denied is not None:
                return refusal(request, requester, f"running {action.command()}", denied)
            admin = state["admin"]
            try:
                message = await asyncio.to_thread(run_action, admin, action)
            except ReplicaChangeRefusedError as exc:
                reason = (
                    "the safety rules refuse this change: "
                    + "; ".join(exc.reasons)
                    + ". Wait until the servers have caught the replicas up (the map shows each "
                    "replica's lag and state), then ask again; the console never overrides the rules"
                )
                audit.warning("console: %s by %s refused: %s", action.command(), requester.describe(), reason)
                return result(request, reason, 409, action)
            except (WaltzError, ConnectionError, TimeoutError) as exc:
                audit.warning("console: %s by %s failed: %s", action.command(), requester.describe(), exc)
                return result(request, str(exc), 502, action)
            audit.info("console: %s by %s done: %s", action.command(), requester.describe(), message)
            observer().look_soon()  # the map shows the change at the next refresh; nothing waits for it
            return result(request, message, 200, action)

        routes += [
            Route("/actions/confirm", confirm, methods=["POST"]),
            Route("/actions/run", run, methods=["POST"]),
        ]
    middleware = [Middleware(_SecurityHeaders), Middleware(_ReadAccess, access=rule)]
    if config.console_host in LOOPBACK_HOSTS:
        # Bound to loopback, the console answers only requests addressed to loopback: a page of
        # another site whose name was made to resolve to 127.0.0.1 (DNS rebinding) gets 400.
        middleware.insert(0, Middleware(TrustedHostMiddleware, allowed_hosts=list(LOOPBACK_HOSTS)))
    return Starlette(routes=routes, lifespan=lifespan, middleware=middleware)
