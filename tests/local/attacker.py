"""An attacker process for tests/local/test_attackers.py: it tries every destructive request it can
with what it is given, and prints what each attempt got back, as JSON. Its store sessions truncate
at a session far above the fence and right above it (which a node takes: only the committed floor
refuses it there).

Run as ``python attacker.py <plan.json>``, in a process of its own, so that it holds only what the
plan names: TLS files (or none), a ZooKeeper credential file (or none), a cluster key (or one made
up), and the addresses to attack. It imports only waltz-py's clients, kazoo and the standard
library, never the test's objects. Each attempt is one line of the report::

    {"attempt": "admin set-fence", "target": "127.0.0.1:40001", "channel": "plaintext",
     "outcome": "PERMISSION_DENIED", "detail": "..."}

``outcome`` is ``ACCEPTED`` when the request went through, else what refused it: a gRPC status
(``PERMISSION_DENIED``, ``UNAVAILABLE``), a storage failure code (``StorageRpcError:<code>``), a
ZooKeeper error (``NoAuth``), a TLS error (``TLS:<reason>``, ``TLS handshake:<reason>`` when the
handshake did not complete), an HTTP status (``HTTP 403``), or
``CLOSED`` (the peer closed the connection without an answer).

Design: docs/design/overview.md, "Roles"; docs/design/zookeeper.md, "Roles".
"""

from __future__ import annotations

import asyncio
import functools
import http.client
import json
import re
import socket
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE

from waltz.errors import StorageRpcError
from waltz.protocol.channels import TlsConfig
from waltz.protocol.records import ReqId
from waltz.protocol.server_client import ServerAdminClient
from waltz.protocol.storage_client import StorageAdminClient, StorageSessionClient, StorageStreamError

#: Seconds one attempt may take.
ATTEMPT_TIMEOUT = 15.0
#: A store session ID far above any fence a test cluster reaches (a session that would win).
HIGH_SESSION = 1 << 40
#: What the HTTP/2 client preface looks like: sent in plaintext to a port that speaks TLS.
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class HandshakeRefusedError(Exception):
    """The TLS handshake did not complete; the argument is OpenSSL's reason."""


def classify(error: BaseException) -> tuple[str, str]:
    """The refusal an attempt met: a short kind, and the message."""
    if isinstance(error, HandshakeRefusedError):
        return f"TLS handshake:{error}", repr(error.__cause__)
    if isinstance(error, StorageStreamError):
        return error.status.name, str(error)
    if isinstance(error, grpc.aio.AioRpcError):
        return error.code().name, str(error.details())
    if isinstance(error, StorageRpcError):
        return f"StorageRpcError:{error.code}", str(error)
    if isinstance(error, NoAuthError):
        return "NoAuth", repr(error)
    if isinstance(error, KazooException):
        return type(error).__name__, repr(error)
    if isinstance(error, urllib.error.HTTPError):
        return f"HTTP {error.code}", error.read().decode(errors="replace")[:300]
    if isinstance(error, urllib.error.URLError) and isinstance(error.reason, BaseException):
        return classify(error.reason)
    if isinstance(error, ssl.SSLError):
        return f"TLS:{error.reason}", str(error)
    if isinstance(error, (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)):
        return "CLOSED", repr(error)
    if isinstance(error, TimeoutError):
        return "TIMEOUT", repr(error)
    return type(error).__name__, repr(error)


class Report:
    """The attempts made so far."""

    def __init__(self) -> None:
        self.lines: list[dict[str, str]] = []

    def add(self, attempt: str, target: str, channel: str, outcome: str, detail: str) -> None:
        self.lines.append(
            {"attempt": attempt, "target": target, "channel": channel, "outcome": outcome, "detail": detail}
        )

    async def grpc(self, attempt: str, target: str, channel: str, call: Callable[[], Awaitable[Any]]) -> None:
        try:
            await asyncio.wait_for(call(), ATTEMPT_TIMEOUT)
        except Exception as error:
            self.add(attempt, target, channel, *classify(error))
        else:
            self.add(attempt, target, channel, "ACCEPTED", "")

    def sync(self, attempt: str, target: str, channel: str, call: Callable[[], object]) -> None:
        try:
            result = call()
        except Exception as error:
            self.add(attempt, target, channel, *classify(error))
        else:
            self.add(attempt, target, channel, "ACCEPTED", repr(result)[:300])


def admin_attempts(partitions: int) -> dict[str, Callable[[StorageAdminClient], Awaitable[Any]]]:
    """The storage admin requests that change or destroy a node's log, by name (the open first)."""
    return {
        "admin open": lambda admin: admin.partition_status(-1),
        "admin set-fence": lambda admin: admin.set_fence(0, HIGH_SESSION, operator="attacker"),
        "admin unassign": lambda admin: admin.assign_partition(0, False),
        "admin delete-partition": lambda admin: admin.assign_partition(
            partitions - 1, False, delete_storage_files=True
        ),
        "admin disable-writes": lambda admin: admin.set_writable(0, False),
        "admin archived-through": lambda admin: admin.set_archived_through(0, HIGH_SESSION),
    }


async def attack_grpc(plan: dict[str, Any], tls: TlsConfig | None, channel: str, report: Report) -> None:
    # Without the cluster key (an application host cannot read it), one made up.
    key, partitions = plan.get("cluster_key") or str(uuid.uuid4()), plan["num_partitions"]

    async def on_admin(address: str, request: Callable[[StorageAdminClient], Awaitable[Any]]) -> None:
        async with StorageAdminClient(address, key, partitions, tls=tls) as admin:
            await request(admin)

    async def truncate(address: str) -> None:
        async with StorageSessionClient(address, key, partitions, HIGH_SESSION, tls=tls) as storage:
            await storage.open_session(0)
            await storage.truncate(0, -1)

    async def fence_of(address: str) -> int:
        # Learn partition 0's fence from a read at session 0: served when it is 0, else fenced,
        # naming it.
        async with StorageSessionClient(address, key, partitions, 0, tls=tls) as probe:
            try:
                await probe.max_transaction_id(0)
            except StorageRpcError as error:
                found = re.search(r"fenced by session (\d+)", error.remote_message)
                if error.code != "SESSION_FENCED" or found is None:
                    raise
                return int(found.group(1))
        return 0

    async def truncate_above_the_fence(address: str) -> None:
        # The session right above the fence, which the node takes, truncates everything.
        fence = await fence_of(address)
        async with StorageSessionClient(address, key, partitions, fence + 1, tls=tls) as storage:
            await storage.truncate(0, -1)

    async def reset_start(address: str) -> None:
        # A reset start erases the replica's log and starts it far ahead, at the fence: what a
        # server's catch-up does across an archived gap, here with nothing archived.
        fence = await fence_of(address)
        async with StorageSessionClient(address, key, partitions, fence, tls=tls) as storage:
            await storage.reset_start(0, 1_000_000)

    async def admin_append(endpoint: str) -> None:
        async with ServerAdminClient(endpoint, tls=tls, timeout=ATTEMPT_TIMEOUT) as admin:
            [outcome] = await admin.append(0, [(ReqId(99, 0, 0, 1), 0, b"forged")])
            if not isinstance(outcome, int):
                raise RuntimeError(f"the admin append failed: {outcome}")

    async def claim(address: str) -> None:
        async with StorageAdminClient(address, str(uuid.uuid4()), partitions, tls=tls) as admin:
            await admin.partition_status(-1)

    attempts: list[Awaitable[None]] = []
    for address in plan["storage_admin"]:
        for name, request in admin_attempts(partitions).items():
            attempts.append(
                report.grpc(name, address, channel, functools.partial(on_admin, address, request))
            )
    for address in plan["storage"]:
        attempts.append(report.grpc("store truncate", address, channel, functools.partial(truncate, address)))
        attempts.append(
            report.grpc(
                "store floor-truncate", address, channel, functools.partial(truncate_above_the_fence, address)
            )
        )
        attempts.append(
            report.grpc("store reset-start", address, channel, functools.partial(reset_start, address))
        )
    for endpoint in plan["servers"]:
        attempts.append(
            report.grpc("server admin-append", endpoint, channel, functools.partial(admin_append, endpoint))
        )
    empty = plan["empty_storage_admin"]
    attempts.append(report.grpc("claim empty-node", empty, channel, functools.partial(claim, empty)))
    await asyncio.gather(*attempts)


def tls_probe(address: str, context: ssl.SSLContext, payload: bytes = HTTP2_PREFACE) -> str:
    """Handshake with a port, send ``payload``, and read: the first bytes of the answer.

    A port that requires a certificate refuses a peer without one in the handshake, with an alert
    (:func:`tls_context` keeps such a peer at TLS 1.2, where the alert comes in the handshake
    itself rather than as a closed connection after it).
    """
    host, _, port = address.rpartition(":")
    with (
        socket.create_connection((host, int(port)), timeout=ATTEMPT_TIMEOUT) as raw,
        context.wrap_socket(raw, server_hostname=host, do_handshake_on_connect=False) as wrapped,
    ):
        try:
            wrapped.do_handshake()
        except ssl.SSLError as error:
            raise HandshakeRefusedError(str(error.reason)) from error
        wrapped.sendall(payload)
        answer = wrapped.recv(64)
    if not answer:
        raise ConnectionResetError("the port closed the connection after the handshake")
    return answer.hex()


def plaintext_probe(address: str) -> str:
    """Send the HTTP/2 preface in plaintext to a port: the first bytes it answers with."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=ATTEMPT_TIMEOUT) as raw:
        raw.sendall(HTTP2_PREFACE + b"\x00" * 64)
        answer = raw.recv(64)
    if not answer:
        raise ConnectionResetError("the port closed the connection without an answer")
    if answer[:1] == b"\x15":  # a TLS alert record: the port speaks only TLS
        raise ssl.SSLError(f"TLS alert record {answer[:7].hex()} in answer to plaintext")
    return answer.hex()


def attack_zookeeper(plan: dict[str, Any], report: Report) -> None:
    digest_file = plan.get("zookeeper_digest_file")
    channel = "zookeeper credential" if digest_file else "zookeeper anonymous"
    auth = [("digest", Path(digest_file).read_text().strip())] if digest_file else []
    zk = KazooClient(hosts=plan["zookeeper"], auth_data=auth, timeout=10)
    zk.start(timeout=15)
    root = plan["root"]
    emptied = b'{"format_version": 1, "replicas": {}}'
    attempts: dict[str, Callable[[], object]] = {
        "zookeeper read cluster-key": lambda: zk.get(f"{root}/cluster"),
        "zookeeper set cluster-params": lambda: zk.set(f"{root}/cluster", b"{}"),
        "zookeeper delete cluster-params": lambda: zk.delete(f"{root}/cluster"),
        "zookeeper set assignment": lambda: zk.set(f"{root}/store/assignment", emptied),
        "zookeeper delete assignment": lambda: zk.delete(f"{root}/store/assignment"),
        "zookeeper set partition": lambda: zk.set(f"{root}/store/partition/0", b"{}"),
        "zookeeper set server-assignment": lambda: zk.set(f"{root}/server/assignment", b"{}"),
        "zookeeper set roles": lambda: zk.set(f"{root}/roles", b"{}"),
        "zookeeper create root-child": lambda: zk.create(f"{root}/intruder", b"x"),
        "zookeeper create partition": lambda: zk.create(f"{root}/store/partition/99", b"{}"),
        "zookeeper create member": lambda: zk.create(f"{root}/server/members/intruder", b"x", ephemeral=True),
        "zookeeper open root-acl": lambda: zk.set_acls(root, OPEN_ACL_UNSAFE),
    }
    client_id = plan.get("client_id_value")
    if client_id is not None:  # where clients take their IDs: they may create there, nothing more
        attempts["zookeeper set client-id"] = lambda: zk.set(f"{root}/client/id", str(client_id).encode())
        attempts["zookeeper set client-ids"] = lambda: zk.set(f"{root}/client/ids", str(client_id).encode())
        attempts["zookeeper delete client-ids"] = lambda: zk.delete(f"{root}/client/ids", recursive=True)
        attempts["zookeeper open client-ids-acl"] = lambda: zk.set_acls(f"{root}/client/ids", OPEN_ACL_UNSAFE)
    try:
        for name, call in attempts.items():
            report.sync(name, plan["zookeeper"], channel, call)
    finally:
        zk.stop()
        zk.close()


def attack_console(
    plan: dict[str, Any], context: ssl.SSLContext | None, channel: str, report: Report
) -> None:
    base = plan["console"] if context is not None else plan["console"].replace("https://", "http://", 1)
    storage = plan["storage"][0]
    forms = {
        "console read": None,
        "console remove-replica": f"kind=remove-replica&partition=1&storage={storage}",
        "console recover-partition": f"kind=recover-partition&partition=0&storage={storage}"
        f"&source={plan['storage'][1]}",
        "console run": "token=anything",
    }
    for name, form in forms.items():
        path = "" if form is None else ("actions/run" if name == "console run" else "actions/confirm")
        request = urllib.request.Request(
            base + path,
            data=None if form is None else form.encode(),
            method="GET" if form is None else "POST",
        )

        def send(request: urllib.request.Request = request) -> int:
            with urllib.request.urlopen(request, timeout=ATTEMPT_TIMEOUT, context=context) as response:
                return int(response.status)

        report.sync(name, base, channel, send)


def tls_context(files: dict[str, str], alpn: str | None = None) -> ssl.SSLContext:
    """A client context trusting ``files["ca"]``, presenting ``cert``/``key`` when given."""
    context = ssl.create_default_context(cafile=files["ca"])
    if files.get("cert"):
        context.load_cert_chain(files["cert"], files["key"])
    else:  # the handshake's own alert, rather than a connection closed after a TLS 1.3 handshake
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    if alpn is not None:
        context.set_alpn_protocols([alpn])
    return context


def probe_ports(plan: dict[str, Any], files: dict[str, str] | None, channel: str, report: Report) -> None:
    """Probe every gRPC port and the console below gRPC: in plaintext, or with TLS and ``files``."""
    for address in [*plan["storage_admin"], *plan["storage"], *plan["servers"]]:
        if files is None:
            report.sync("probe", address, channel, functools.partial(plaintext_probe, address))
        else:  # gRPC's protocol, h2
            report.sync(
                "probe", address, channel, functools.partial(tls_probe, address, tls_context(files, "h2"))
            )
    if files is not None:
        console = urllib.parse.urlsplit(plan["console"]).netloc
        request = f"GET / HTTP/1.1\r\nHost: {console}\r\n\r\n".encode()
        report.sync(
            "probe", console, channel, functools.partial(tls_probe, console, tls_context(files), request)
        )


def main(plan_path: str) -> None:
    plan = json.loads(Path(plan_path).read_text())
    report = Report()
    for channel in plan["channels"]:
        name, files = channel["name"], channel["tls"]
        paths = (Path(files[k]) if files.get(k) else None for k in ("ca", "cert", "key")) if files else ()
        asyncio.run(attack_grpc(plan, TlsConfig(*paths) if files else None, name, report))
        probe_ports(plan, files, name, report)
        attack_console(plan, tls_context(files) if files else None, name, report)
    attack_zookeeper(plan, report)
    json.dump(report.lines, sys.stdout, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
