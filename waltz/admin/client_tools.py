"""Client-side checks of a cluster (``waltz client ...``): serializability, high-water marks, reachability.

Design: docs/design/locks.md "The compatibility rule" (a WRITE lock rejects an append whose client
high-water mark is older than the lock's last writer); docs/design/client.md "The client's parts".

:func:`run_validation` is upstream Waltz's client validation: ``producers`` clients in this process
each submit ``transactions`` transactions to the chosen partitions; every transaction takes the
same WRITE lock of its partition and carries the client's high-water mark plus one. The lock makes
a transaction commit only if no other writer committed after the client's high-water mark, so
each committed transaction's number equals its own transaction ID. A separate client then reads
the partitions back through its feed and names every transaction whose number is not its ID. The
partitions checked must have no other writer meanwhile.

The number is carried as an empty change-set (no row change) whose ``meta`` holds it under
:data:`VALIDATION_META_KEY`, so that an application of the SQL framework that later mounts the
partitions applies these transactions as changing nothing; an older form, header 0 and the number
in ASCII digits, is still read back (:func:`validation_number`; docs/design/sql.md, "Change-sets").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import grpc

from waltz.admin.description import describe_cluster
from waltz.admin.storage_nodes import (
    StorageAccessDeniedError,
    StorageUnreachableError,
    call_admin,
    describe_failure,
    probe_tcp,
)
from waltz.client import (
    Outcome,
    PartitionLocalLock,
    Transaction,
    TransactionBuilder,
    TransactionContext,
    WaltzClient,
    WaltzClientCallbacks,
    WaltzClientConfig,
)
from waltz.errors import StorageRpcError, WaltzError, WaltzTimeoutError
from waltz.jdbc_style.changeset import CHANGE_SET_HEADER, ChangeSet
from waltz.metadata.assignment import read_members
from waltz.metadata.zk import ClusterZk
from waltz.metadata.zk_session import ZooKeeperAuthError, connect_zookeeper, zookeeper_access
from waltz.protocol import client_pb2, client_pb2_grpc
from waltz.protocol.channels import CLIENT_TLS_SETTINGS, TlsConfig, open_channel, tls_settings_hint
from waltz.protocol.event_loop import run_on_shared_loop
from waltz.protocol.server_client import ServerAdminClient
from waltz.protocol.storage_client import StorageAdminClient

__all__ = [
    "VALIDATION_LOCK",
    "VALIDATION_META_KEY",
    "Mismatch",
    "NodeCheck",
    "ValidationReport",
    "check_connectivity",
    "high_water_marks",
    "run_validation",
    "validation_number",
]

log = logging.getLogger(__name__)

#: The name of the validation's WRITE lock (lock ID 0 of each partition).
VALIDATION_LOCK = "waltz-validate"
#: The key of a validation transaction's number in its change-set's ``meta``.
VALIDATION_META_KEY = "waltz_validate"
#: Seconds a client may take to mount its partitions.
MOUNT_TIMEOUT = 60.0


class _MarkCallbacks(WaltzClientCallbacks):
    """In-memory client high-water marks; optionally keeps each applied transaction's data."""

    def __init__(self, start_marks: Mapping[int, int], keep_data: bool = False) -> None:
        self._marks = dict(start_marks)
        self._keep_data = keep_data
        #: partition -> transaction ID -> (header, data)
        self.data: dict[int, dict[int, tuple[int, bytes]]] = {}
        self.errors: list[str] = []

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return self._marks.get(partition_id, -1)

    def apply_transaction(self, transaction: Transaction) -> None:
        if self._keep_data:
            self.data.setdefault(transaction.partition_id, {})[transaction.transaction_id] = (
                transaction.header,
                transaction.get_raw_data(),
            )
        self._marks[transaction.partition_id] = transaction.transaction_id

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        self.errors.append(f"partition {partition_id} transaction {transaction_id}: {exception!r}")


class _ValidationContext(TransactionContext):
    """One validation transaction: data = client high-water mark + 1, under the partition's lock."""

    def __init__(self, partition: int) -> None:
        super().__init__()
        self.partition = partition
        self.attempts = 0

    def partition_id(self, num_partitions: int) -> int:
        return self.partition

    def execute(self, builder: TransactionBuilder) -> bool:
        self.attempts += 1
        builder.set_header(CHANGE_SET_HEADER)
        builder.set_raw_data(validation_data(builder.client_high_water_mark + 1))
        builder.set_write_locks([PartitionLocalLock(VALIDATION_LOCK, 0)])
        return True


def validation_data(number: int) -> bytes:
    """The data of a validation transaction carrying ``number`` (header ``CHANGE_SET_HEADER``):
    an empty change-set with ``{"waltz_validate": number}`` as its ``meta``."""
    return ChangeSet([], meta={VALIDATION_META_KEY: number}).encode()


def validation_number(header: int, data: bytes) -> int | None:
    """The number a validation transaction carries, in either form: an empty change-set whose
    ``meta`` holds it (:func:`validation_data`), or header 0 and ASCII digits (the older form);
    None for any other transaction (an application's, a damaged one)."""
    if header == CHANGE_SET_HEADER:
        try:
            change_set = ChangeSet.decode(data)
        except Exception:  # not a change-set this code reads: not a validation transaction
            return None
        number = change_set.meta.get(VALIDATION_META_KEY)
        if change_set.changes or isinstance(number, bool) or not isinstance(number, int):
            return None
        return number
    if header == 0 and data.isascii() and data.isdigit():
        return int(data)
    return None


@dataclass(frozen=True, slots=True)
class Mismatch:
    """A committed transaction that carries no validation number, or another than its own
    transaction ID (:func:`validation_number`)."""

    partition_id: int
    transaction_id: int
    data: bytes

    def __str__(self) -> str:
        shown = self.data[:40]
        return (
            f"partition {self.partition_id} transaction {self.transaction_id}: data {shown!r} is not its "
            "transaction ID"
        )


@dataclass(frozen=True, slots=True)
class ValidationReport:
    """The outcome of :func:`run_validation`.

    Attributes:
        partitions: the partitions written and checked.
        submitted: transactions submitted in all.
        committed: transactions the producers saw committed.
        retries: attempts beyond the first (lock failures), in all.
        checked: partition -> ``(first, last)`` transaction IDs read back and checked.
        mismatches: transactions whose data is not their ID.
        errors: other failures (a producer's transaction failed, a read-back error).
        seconds: the run's duration.
    """

    partitions: tuple[int, ...]
    submitted: int
    committed: int
    retries: int
    checked: Mapping[int, tuple[int, int]]
    mismatches: tuple[Mismatch, ...]
    errors: tuple[str, ...] = ()
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        """True when every checked transaction's data is its ID and nothing failed."""
        return not self.mismatches and not self.errors

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict (``waltz client validate --json``)."""
        return {
            "passed": self.passed,
            "partitions": list(self.partitions),
            "submitted": self.submitted,
            "committed": self.committed,
            "retries": self.retries,
            "checked": {str(p): {"first": a, "last": b} for p, (a, b) in sorted(self.checked.items())},
            "mismatches": [
                {
                    "partition_id": m.partition_id,
                    "transaction_id": m.transaction_id,
                    "data": m.data.decode("utf-8", "replace"),
                }
                for m in self.mismatches
            ],
            "errors": list(self.errors),
            "seconds": round(self.seconds, 3),
        }


def high_water_marks(config: WaltzClientConfig, partitions: Sequence[int] | None = None) -> dict[int, int]:
    """Each partition's committed high-water mark, as a client sees it (asked of the owning server).

    Args:
        config: the client configuration of the cluster (``client.autoMount`` is turned off).
        partitions: the partitions to ask about; None means all.

    Returns:
        Partition ID -> high-water mark (-1: empty).

    Raises:
        WaltzError: ZooKeeper or a server did not answer (:class:`WaltzTimeoutError` after the
            client's request timeout).
        ValueError: a partition does not exist.
    """
    quiet = config.model_copy(update={"client_auto_mount": False})
    with WaltzClient(_MarkCallbacks({}), quiet) as client:
        ids = client.partition_ids if partitions is None else partitions
        return {pid: client.get_high_water_mark(pid) for pid in ids}


def _mounted_client(
    config: WaltzClientConfig,
    callbacks: _MarkCallbacks,
    partitions: Sequence[int],
    timeout: float = MOUNT_TIMEOUT,
) -> WaltzClient:
    client = WaltzClient(callbacks, config.model_copy(update={"client_auto_mount": False}))
    try:
        client.set_partitions(partitions)
        client.wait_mounted(timeout, partitions)
    except WaltzTimeoutError as exc:
        client.close()
        if callbacks.errors:  # what the servers said while it tried (a feed that could not be read)
            raise WaltzTimeoutError(f"{exc}; the last error reported: {callbacks.errors[-1]}") from exc
        raise
    except BaseException:
        client.close()
        raise
    return client


def run_validation(
    config: WaltzClientConfig,
    *,
    producers: int,
    transactions: int,
    partitions: Sequence[int] | None = None,
    since: int | None = None,
    timeout: float = 120.0,
    progress: Callable[[int], None] | None = None,
) -> ValidationReport:
    """Run the serializability check (see the module docstring).

    Args:
        config: the client configuration of the cluster.
        producers: producer clients (each a :class:`WaltzClient` of this process).
        transactions: transactions each producer submits, spread round-robin over ``partitions``.
        partitions: the partitions to write and check; None means all.
        since: check the transactions after this ID (-1: the whole log); None means after each
            partition's high-water mark at the start (this run's transactions only).
        timeout: seconds the producers and the read-back may take, each.
        progress: called with the number of transactions that ended, as they end.

    Returns:
        The report; ``passed`` is False when a transaction's data is not its ID or a transaction
        failed.

    Raises:
        WaltzError: the cluster could not be reached, or a client did not mount in time.
        ValueError: a partition does not exist, or a count is below 1.
    """
    if producers < 1 or transactions < 1:
        raise ValueError(f"producers and transactions must be at least 1, got {producers}, {transactions}")
    started = time.monotonic()
    start_marks = high_water_marks(config, partitions)
    ids = tuple(sorted(start_marks))
    if not ids:
        raise ValueError("no partition to validate")
    errors: list[str] = []
    clients: list[WaltzClient] = []
    contexts: list[_ValidationContext] = []
    futures: list[concurrent.futures.Future[Outcome]] = []
    ended = 0
    ended_lock = threading.Lock()

    def on_end(_: concurrent.futures.Future[Outcome]) -> None:
        nonlocal ended
        with ended_lock:
            ended += 1
            count = ended
        if progress is not None:
            progress(count)

    try:
        for _ in range(producers):
            clients.append(
                _mounted_client(config, _MarkCallbacks(start_marks), ids, min(MOUNT_TIMEOUT, timeout))
            )

        def produce(client: WaltzClient, index: int) -> None:
            try:
                for n in range(transactions):
                    context = _ValidationContext(ids[(index + n) % len(ids)])
                    contexts.append(context)
                    future = client.submit(context)
                    future.add_done_callback(on_end)
                    futures.append(future)
            except WaltzError as exc:
                errors.append(f"producer {index} could not submit: {exc}")

        threads = [
            threading.Thread(target=produce, args=(c, i), name=f"waltz-validate-{i}", daemon=True)
            for i, c in enumerate(clients)
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.1, deadline - time.monotonic()))
        committed = 0
        for future in list(futures):
            try:
                if future.result(max(0.1, deadline - time.monotonic())).committed:
                    committed += 1
            except concurrent.futures.TimeoutError:
                errors.append(f"a transaction was still in flight after {timeout:g}s")
                break
            except WaltzError as exc:
                errors.append(f"a transaction failed: {exc}")
    finally:
        for client in clients:
            client.close()
    end_marks = high_water_marks(config, ids)
    first = {pid: (start_marks[pid] if since is None else since) + 1 for pid in ids}
    checked = {pid: (first[pid], end_marks[pid]) for pid in ids if end_marks[pid] >= first[pid]}
    mismatches: list[Mismatch] = []
    reader = _MarkCallbacks({pid: first[pid] - 1 for pid in ids}, keep_data=True)
    with _mounted_client(config, reader, ids, min(MOUNT_TIMEOUT, timeout)) as client:
        for pid, (_, last) in checked.items():
            if not client.wait_applied(pid, last, timeout):
                raise WaltzTimeoutError(
                    f"the read-back client did not reach transaction {last} of partition {pid} "
                    f"in {timeout:g}s"
                )
    errors.extend(reader.errors)
    for pid, (low, last) in sorted(checked.items()):
        data = reader.data.get(pid, {})
        for transaction_id in range(low, last + 1):
            read = data.get(transaction_id)
            if read is None:
                errors.append(f"partition {pid} transaction {transaction_id} was not read back")
            elif validation_number(*read) != transaction_id:
                mismatches.append(Mismatch(pid, transaction_id, read[1]))
    return ValidationReport(
        partitions=ids,
        submitted=len(contexts),
        committed=committed,
        retries=sum(max(0, c.attempts - 1) for c in contexts),
        checked=checked,
        mismatches=tuple(mismatches),
        errors=tuple(errors),
        seconds=time.monotonic() - started,
    )


# ---- connectivity --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeCheck:
    """One node's connectivity check.

    Attributes:
        kind: ``server``, ``storage`` (the storage port) or ``storage-admin`` (the admin port).
        name: the server's member name, or the storage node's connect string.
        address: ``host:port`` tried.
        error: what failed, or None when it answered.
        detail: what it answered (e.g. its partitions), when it did; why it was not checked.
        skipped: not checked (the storage nodes, when the ZooKeeper credential cannot list them).
    """

    kind: str
    name: str
    address: str
    error: str | None = None
    detail: str = ""
    skipped: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class _Targets:
    servers: list[tuple[str, str]] = field(default_factory=list)
    storages: list[tuple[str, str | None]] = field(default_factory=list)
    cluster_key: str = ""
    num_partitions: int = 0
    storages_hidden: bool = False


def _targets(config: WaltzClientConfig, timeout: float) -> _Targets:
    zk = connect_zookeeper(
        config.zookeeper_connect_string,
        connect_timeout=timeout,
        session_timeout=config.zookeeper_session_timeout,
        security=config.zookeeper_security(),
    )
    try:
        cluster = ClusterZk(zk, config.cluster_root)
        cluster.check_security()
        with zookeeper_access(zk, f"reading the servers' members under {cluster.paths.members}"):
            members = read_members(zk, cluster.paths)
        try:
            description = describe_cluster(cluster)
        except ZooKeeperAuthError:  # the client role: no cluster key, no storage nodes
            servers = [(m.name, m.endpoint) for m in members]
            return _Targets(servers, num_partitions=cluster.discovery().num_partitions, storages_hidden=True)
    finally:
        zk.stop()
        zk.close()
    return _Targets(
        [(m.name, m.endpoint) for m in members],
        [(n.connect_string, n.admin_address) for n in description.storage_nodes],
        str(description.params.cluster_key),
        description.params.num_partitions,
    )


async def _check_server(name: str, endpoint: str, timeout: float, tls: TlsConfig | None) -> NodeCheck:
    try:
        async with ServerAdminClient(endpoint, tls=tls, timeout=timeout) as client:
            status = await asyncio.wait_for(client.status(), timeout)
    except grpc.aio.AioRpcError as exc:
        if exc.code() is grpc.StatusCode.PERMISSION_DENIED:  # a client certificate: no status
            return await _check_client_service(name, endpoint, timeout, tls)
        failure = f"{exc.code().name}: {exc.details()}"
        if exc.code() is grpc.StatusCode.UNAVAILABLE:
            failure = _with_tls_hint(failure, tls)
        return NodeCheck("server", name, endpoint, failure)
    except (TimeoutError, OSError) as exc:
        failure = _with_tls_hint(str(exc) or f"no answer within {timeout:g}s", tls)
        return NodeCheck("server", name, endpoint, failure)
    partitions = ",".join(str(p.partition_id) for p in status.partitions) or "none"
    return NodeCheck("server", name, endpoint, None, f"serves partitions {partitions}")


def _with_tls_hint(failure: str, tls: TlsConfig | None) -> str:
    """A server's failure, with what the client's TLS settings may have to do with it."""
    hint = tls_settings_hint(tls, CLIENT_TLS_SETTINGS)
    return f"{failure}; {hint}" if hint else failure


async def _check_client_service(name: str, endpoint: str, timeout: float, tls: TlsConfig | None) -> NodeCheck:
    """Reach a server's client service, as a certificate of the ``client`` role may (the status
    of the admin service needs ``operator``): ask for the data of a transaction that cannot exist."""
    channel = open_channel(endpoint, tls)
    try:
        stub = client_pb2_grpc.WaltzServerServiceStub(channel)
        request = client_pb2.TransactionDataRequest(transaction_id=-1)
        await stub.GetTransactionData(request, timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        return NodeCheck("server", name, endpoint, f"{exc.code().name}: {exc.details()}")
    finally:
        await channel.close(None)
    return NodeCheck(
        "server", name, endpoint, None, "client service answers (status needs the operator role)"
    )


async def _check_storage_admin(
    name: str, address: str | None, targets: _Targets, timeout: float, tls: TlsConfig | None
) -> NodeCheck:
    if address is None:
        return NodeCheck("storage-admin", name, "?", "no admin port on record in store/connection")

    async def status(admin: StorageAdminClient) -> str:
        response = await admin.partition_status(-1)
        return ",".join(str(p.partition_id) for p in response.partitions) or "none"

    try:
        held = await call_admin(
            address,
            targets.cluster_key,
            targets.num_partitions,
            status,
            timeout=timeout,
            tls=tls,
            initialise=False,
            tls_settings=CLIENT_TLS_SETTINGS,
        )
    except StorageAccessDeniedError:  # reached over TLS; the certificate is not an operator's
        return NodeCheck("storage-admin", name, address, None, "answers (its status needs the operator role)")
    except (StorageUnreachableError, StorageRpcError) as exc:
        return NodeCheck("storage-admin", name, address, describe_failure(exc))
    return NodeCheck("storage-admin", name, address, None, f"holds partitions {held}")


async def _check_storage_port(name: str, timeout: float) -> NodeCheck:
    failure = await probe_tcp(name, timeout)
    return NodeCheck("storage", name, name, failure, "accepts connections" if failure is None else "")


def check_connectivity(
    config: WaltzClientConfig, *, timeout: float = 5.0, storage_tls: TlsConfig | None = None
) -> list[NodeCheck]:
    """Check that every live server and every storage node of the cluster answers.

    Servers are asked for their status on their client port (with the client's TLS,
    ``client.ssl.*``); storage nodes get a TCP connection on their storage port and an admin open
    with a partition status request on their admin port (with ``storage_tls``).

    Args:
        config: the client configuration of the cluster.
        timeout: seconds for ZooKeeper and for each node.
        storage_tls: client TLS files for the storage admin ports, or None for plaintext.

    Returns:
        One check per server, per storage port and per storage admin port, servers first. With
        the client role's ZooKeeper credential, which may not read the storage nodes nor the
        cluster key (docs/design/zookeeper.md, "Roles"), the servers only, and a line saying so.

    Raises:
        WaltzError: ZooKeeper did not answer, or the cluster's znodes are missing.
    """
    targets = _targets(config, timeout)
    tls = config.tls()

    async def run() -> list[NodeCheck]:
        checks = [_check_server(n, e, timeout, tls) for n, e in targets.servers]
        for name, admin in targets.storages:
            checks.append(_check_storage_port(name, timeout))
            checks.append(_check_storage_admin(name, admin, targets, timeout, storage_tls))
        results = list(await asyncio.gather(*checks))
        if targets.storages_hidden:
            hidden = (
                "not checked: listing the storage nodes needs the operator's ZooKeeper credential (an "
                "application's cannot read them); waltz cluster verify checks them"
            )
            results.append(NodeCheck("storage", "-", "-", None, hidden, skipped=True))
        return results

    return run_on_shared_loop(run())
