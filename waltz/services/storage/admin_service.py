"""The storage admin protocol's gRPC service of a storage node: the admin port.

Design: docs/design/storage.md "Admin port"; docs/design/archive.md, "Retention on the storage
nodes" (set archived-through, a partition created to start at a transaction, the local start and
archived-through in the partition status). Tools that must not take part in store sessions (the
cluster CLI, the Spark reader, the archiver, live disk checks) use it. With mutual TLS the stream
needs the ``operator`` or ``admin`` role, and the requests that change the node the ``admin`` role
(docs/design/overview.md, "Roles"). The changes an operator makes to what fences store sessions or
to what retention may delete (set-fence, set archived-through) are logged at WARNING on the
``waltz.services.storage.audit`` logger, and so are an unassignment that deletes a partition's
files and a truncation below the committed transactions,
which only an ``admin`` certificate over mutual TLS may ask for (docs/design/storage.md, "The
committed floor").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

import grpc

from waltz.errors import ProtocolError, RecordsArchivedError
from waltz.protocol import storage_pb2, storage_pb2_grpc
from waltz.protocol.roles import (
    ADMIN_ROLES,
    INITIALISE_ROLES,
    OPERATOR_ROLES,
    Role,
    authorize,
    denial,
    peer_roles,
    role_uri,
)
from waltz.services.storage.control_file import FenceReset
from waltz.services.storage.metrics import StorageMetrics
from waltz.services.storage.node import StorageNode
from waltz.services.storage.service import StorageServicer, failure_for, last_session_info, outcome_label
from waltz.services.storage.storage_partition import StoragePartition

__all__ = ["CERTIFIED_ADMIN_REQUESTS", "CHANGING_ADMIN_REQUESTS", "StorageAdminServicer"]

log = logging.getLogger(__name__)
#: The audit trail of operator commands that change what fences store sessions (``set-fence``) or
#: what retention may delete (``set archived through``).
audit_log = logging.getLogger("waltz.services.storage.audit")

FailureCode = storage_pb2.FailureCode

#: Admin requests that change the node (assignment and file deletion, read and write switches,
#: fences, archived-through, the partition count): with mutual TLS only the ``admin`` role may
#: make them.
CHANGING_ADMIN_REQUESTS: Final = frozenset(
    {
        "partition_assignment",
        "partition_read",
        "partition_write",
        "set_fence",
        "set_archived_through",
        "truncate_below_committed",
        "grow_partitions",
    }
)
#: Admin requests that need an ``admin`` certificate even where the port has no mutual TLS (no
#: peer identity): what they destroy is committed (docs/design/storage.md, "The committed floor").
CERTIFIED_ADMIN_REQUESTS: Final = frozenset({"truncate_below_committed"})


class StorageAdminServicer(storage_pb2_grpc.StorageAdminServiceServicer):
    """The storage admin protocol (docs/design/storage.md "Admin port").

    Tools that must not take part in store sessions (cluster CLI, Spark reader, disk checks on a
    live node) use it; it never fences a store session, except for the operator's explicit
    ``set_fence``, which is logged at WARNING on the ``waltz.services.storage.audit`` logger, as is
    ``set_archived_through``.
    """

    def __init__(self, node: StorageNode, metrics: StorageMetrics, storage: StorageServicer) -> None:
        self._node = node
        self._metrics = metrics
        self._storage = storage

    async def Session(  # noqa: N802 - gRPC method name
        self,
        request_iterator: AsyncIterator[storage_pb2.AdminRequests],
        context: grpc.aio.ServicerContext[storage_pb2.AdminRequests, storage_pb2.AdminResponses],
    ) -> AsyncIterator[storage_pb2.AdminResponses]:
        """Serve one admin stream: an admin open request, then admin requests in order.

        With mutual TLS the stream needs the ``operator`` or ``admin`` role, and the requests that
        change the node (:data:`CHANGING_ADMIN_REQUESTS`) the ``admin`` role: one of those from an
        operator ends the stream with PERMISSION_DENIED (docs/design/overview.md, "Roles"). So does
        an operator's admin open of a node that has no control file yet: only ``admin``
        (:data:`~waltz.protocol.roles.INITIALISE_ROLES`) initialises a node.
        """
        await authorize(context, OPERATOR_ROLES, "the storage admin service", request_iterator)
        roles = peer_roles(context)
        opened = False
        iterator = request_iterator.__aiter__()
        while True:
            try:
                batch = await iterator.__anext__()
            except StopAsyncIteration:
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # bytes gRPC could not parse: say so, as the Session of stores does
                log.info("admin stream from %s ended: %s", context.peer(), exc)
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"unreadable admin request stream: {type(exc).__name__}: {exc}",
                )
                raise AssertionError("unreachable") from exc  # abort raises
            responses = []
            for request in batch.requests:
                kind = request.WhichOneof("body")
                if kind in CHANGING_ADMIN_REQUESTS:
                    refused = denial(roles, ADMIN_ROLES, f"the admin request {kind}")
                    if refused is not None:
                        log.warning("admin stream from %s: %s", context.peer(), refused)
                        await context.abort(grpc.StatusCode.PERMISSION_DENIED, refused)
                if kind in CERTIFIED_ADMIN_REQUESTS and roles is None:
                    refused = (
                        f"the admin request {kind} needs a certificate with the role "
                        f"{role_uri(Role.ADMIN)} over mutual TLS; this admin port has no client "
                        'certificates, so it refuses it (see docs/operations.md, "Roles")'
                    )
                    log.warning("admin stream from %s: %s", context.peer(), refused)
                    await context.abort(grpc.StatusCode.PERMISSION_DENIED, refused)
                if kind == "open" and not self._node.initialized and not request.open.existing_only:
                    refused = denial(roles, INITIALISE_ROLES, "initialising an empty storage node")
                    if refused is not None:
                        log.warning("admin stream from %s: %s", context.peer(), refused)
                        await context.abort(grpc.StatusCode.PERMISSION_DENIED, refused)
                try:
                    if kind == "open":
                        await asyncio.to_thread(
                            self._node.admin_open,
                            request.open.cluster_key,
                            request.open.num_partitions,
                            initialise=(
                                not request.open.existing_only and denial(roles, INITIALISE_ROLES, "") is None
                            ),
                        )
                        opened = True
                        response = _admin_response(request, success=storage_pb2.SuccessResponse())
                    elif not opened:
                        raise ProtocolError("the admin stream is not open: send an admin open request first")
                    else:
                        response = await self._serve(request, kind, context)
                except Exception as exc:
                    # A read below the local start is routine for a reader (it goes to the archive).
                    quiet = isinstance(exc, RecordsArchivedError)
                    log.log(
                        logging.DEBUG if quiet else logging.WARNING, "admin %s request failed: %s", kind, exc
                    )
                    failure = failure_for(exc)
                    if not opened and kind != "open":
                        failure.exception.code = FailureCode.NOT_OPEN
                    response = _admin_response(request, failure=failure)
                outcome = outcome_label(response.failure if response.HasField("failure") else None)
                self._metrics.requests.labels(f"admin_{kind}", outcome).inc()
                responses.append(response)
            yield storage_pb2.AdminResponses(responses=responses)

    async def _serve(
        self, request: storage_pb2.AdminRequest, kind: str | None, context: grpc.aio.ServicerContext[Any, Any]
    ) -> storage_pb2.AdminResponse:
        node = self._node
        pid = request.partition_id
        if kind == "set_fence":
            return _admin_response(request, set_fence=await self._set_fence(request, context))
        if kind == "truncate_below_committed":
            return _admin_response(
                request, truncate_below_committed=await self._truncate_below_committed(request, context)
            )
        if kind == "grow_partitions":
            return _admin_response(request, grow_partitions=await self._grow(request, context))
        if kind == "set_archived_through":
            await self._set_archived_through(request, context)
            return _admin_response(request, success=storage_pb2.SuccessResponse())
        if kind == "partition_assignment":
            body = request.partition_assignment
            deleting = not body.toggled and body.delete_storage_files
            try:
                await asyncio.to_thread(
                    node.set_assignment,
                    pid,
                    body.toggled,
                    delete_files=body.delete_storage_files,
                    first_transaction_id=body.first_transaction_id,
                )
            except Exception as exc:
                if deleting:  # some files may be gone: on the trail too
                    audit_log.warning(
                        "AUDIT unassign with files deleted FAILED: partition %d; from %s%s: %s",
                        pid,
                        context.peer(),
                        _peer_identity(context),
                        exc,
                    )
                raise
            if not body.toggled:
                self._metrics.forget_partition(pid)
            if deleting:
                audit_log.warning(
                    "AUDIT unassign with files deleted: partition %d; from %s%s",
                    pid,
                    context.peer(),
                    _peer_identity(context),
                )
            return _admin_response(request, success=storage_pb2.SuccessResponse())
        if kind in ("partition_read", "partition_write"):
            partition = node.partition(pid)
            toggled = (
                request.partition_read.toggled
                if kind == "partition_read"
                else request.partition_write.toggled
            )

            def toggle() -> None:
                if kind == "partition_read":
                    partition.readable = toggled
                else:
                    partition.writable = toggled

            await node.run(pid, toggle)
            log.info(
                "partition %d: %s set to %s",
                pid,
                "readable" if kind == "partition_read" else "writable",
                toggled,
            )
            return _admin_response(request, success=storage_pb2.SuccessResponse())
        if kind == "metrics":
            return _admin_response(
                request, metrics=storage_pb2.MetricsResponse(values=self._metrics.snapshot())
            )
        if kind == "partition_status":
            return _admin_response(request, partition_status=await self._status(pid))
        partition = node.partition(pid)
        work: Callable[[], storage_pb2.AdminResponse]
        if kind == "record_list":

            def work() -> storage_pb2.AdminResponse:
                return _admin_response(
                    request, record_list=self._storage.record_list(partition, request.record_list)
                )

        elif kind == "last_session_info":

            def work() -> storage_pb2.AdminResponse:
                return _admin_response(request, last_session_info=last_session_info(partition))

        elif kind == "max_transaction_id":

            def work() -> storage_pb2.AdminResponse:
                return _admin_response(
                    request,
                    max_transaction_id=storage_pb2.MaxTransactionIdResponse(
                        transaction_id=partition.max_transaction_id
                    ),
                )

        else:
            raise ProtocolError(f"unknown admin request {kind!r}")
        return await node.run(pid, work)

    async def _set_fence(
        self, request: storage_pb2.AdminRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> storage_pb2.SetFenceResponse:
        """Set a partition's fence (docs/design/storage.md "Admin port") and log the audit line.

        Raises:
            ProtocolError: the new fence is below -1.
            PartitionNotAssignedError, CorruptDataError: as any partition request.
        """
        body = request.set_fence
        pid = request.partition_id
        if body.session_id < -1:
            raise ProtocolError(f"partition {pid}: a fence cannot be {body.session_id} (at least -1)")
        partition = self._node.partition(pid)
        expected = body.expected_fence if body.HasField("expected_fence") else None

        def reset_fence() -> FenceReset:
            # On the partition's thread: nothing raises the fence between the check and the change.
            if expected is not None and partition.current_session_id != expected:
                raise ProtocolError(
                    f"partition {pid}: the fence is {partition.current_session_id}, not {expected} as "
                    "expected: a store session moved it since it was read; read it again"
                )
            return partition.reset_fence(body.session_id)

        reset = await self._node.run(pid, reset_fence)
        audit_log.warning(
            "AUDIT set-fence: partition %d fence %d -> %d%s; by operator %r (as the tool states it) "
            "from %s%s; reason: %r",
            pid,
            reset.previous_fence,
            reset.fence,
            (
                f", last session info's session {reset.previous_last_session_id} -> {reset.last_session_id}"
                if reset.previous_last_session_id != reset.last_session_id
                else ""
            ),
            body.operator or "(not given)",
            context.peer(),
            _peer_identity(context),
            body.reason or "(not given)",
        )
        return storage_pb2.SetFenceResponse(
            previous_fence=reset.previous_fence,
            fence=reset.fence,
            previous_last_session_id=reset.previous_last_session_id,
            last_session_id=reset.last_session_id,
        )

    async def _grow(
        self, request: storage_pb2.AdminRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> storage_pb2.GrowPartitionsResponse:
        """Grow the node's partition count (docs/design/storage.md, "Partition count") and log the
        audit line when it grew. The caller checked the ``admin`` role.

        Raises:
            ProtocolError: a shrink, or a count that is not a whole multiple of the node's.
            OSError: the control file could not be written again (the old count stays).
        """
        body = request.grow_partitions
        before, after = await asyncio.to_thread(self._node.grow, body.num_partitions)
        if after != before:
            audit_log.warning(
                "AUDIT grow-partitions: partition count %d -> %d; by operator %r (as the tool states it) "
                "from %s%s",
                before,
                after,
                body.operator or "(not given)",
                context.peer(),
                _peer_identity(context),
            )
        return storage_pb2.GrowPartitionsResponse(previous_num_partitions=before, num_partitions=after)

    async def _truncate_below_committed(
        self, request: storage_pb2.AdminRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> storage_pb2.TruncateBelowCommittedResponse:
        """Truncate a partition below its committed transactions (docs/design/storage.md, "The
        committed floor") and log the audit line. The caller checked the ``admin`` role.

        Raises:
            ProtocolError: the transaction is below -1 or below the local start - 1.
            PartitionNotAssignedError, PartitionUnavailableError, CorruptDataError: as any
                partition request.
        """
        body = request.truncate_below_committed
        pid = request.partition_id
        partition = self._node.partition(pid)
        done = await self._node.run(pid, lambda: partition.truncate_below_committed(body.transaction_id))
        self._metrics.max_transaction_id.labels(str(pid)).set(done.max_transaction_id)
        audit_log.warning(
            "AUDIT truncate-below-committed: partition %d truncated from transaction %d to %d (%d "
            "record(s) removed), low-water mark %d -> %d; by operator %r (as the tool states it) from "
            "%s%s; reason: %r",
            pid,
            done.previous_max_transaction_id,
            done.max_transaction_id,
            done.previous_max_transaction_id - done.max_transaction_id,
            done.previous_low_water_mark,
            done.low_water_mark,
            body.operator or "(not given)",
            context.peer(),
            _peer_identity(context),
            body.reason or "(not given)",
        )
        return storage_pb2.TruncateBelowCommittedResponse(
            previous_max_transaction_id=done.previous_max_transaction_id,
            max_transaction_id=done.max_transaction_id,
            previous_low_water_mark=done.previous_low_water_mark,
            low_water_mark=done.low_water_mark,
        )

    async def _set_archived_through(
        self, request: storage_pb2.AdminRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        """Keep a partition's archived-through (docs/design/archive.md, "Retention on the storage
        nodes") in its retention file, and log the audit line.

        Raises:
            ProtocolError: the value is below -1.
            PartitionNotAssignedError, CorruptDataError: as any partition request.
            OSError: the retention file could not be written (the value stays).
        """
        body = request.set_archived_through
        pid = request.partition_id
        partition = self._node.partition(pid)

        def set_archived_through() -> tuple[int, int]:
            previous = partition.set_archived_through(
                body.transaction_id, archive=body.archive, operator=body.operator
            )
            return previous, partition.local_start

        previous, local_start = await self._node.run(pid, set_archived_through)
        self._metrics.set_retention_state(pid, local_start, body.transaction_id)
        audit_log.warning(
            "AUDIT set-archived-through: partition %d archived through %d -> %d (archive %r; local start "
            "%d, retention %s); by operator %r (as the tool states it) from %s%s",
            pid,
            previous,
            body.transaction_id,
            body.archive or "(not given)",
            local_start,
            self._node.retention.policy.value,
            body.operator or "(not given)",
            context.peer(),
            _peer_identity(context),
        )

    async def _status(self, partition_id: int) -> storage_pb2.PartitionStatusResponse:
        node = self._node
        control = node.control_file
        response = storage_pb2.PartitionStatusResponse(
            num_partitions=control.num_partitions, cluster_key=str(control.cluster_key)
        )
        policy = node.retention.policy.value
        ids = node.assigned_partitions() if partition_id == -1 else [partition_id]
        for pid in ids:
            partition = node.partition(pid)

            def status(partition: StoragePartition = partition) -> storage_pb2.PartitionStatus:
                info = partition.last_session_info()
                corruption = partition.corruption
                return storage_pb2.PartitionStatus(
                    partition_id=partition.partition_id,
                    readable=partition.readable,
                    writable=partition.writable,
                    session_id=partition.current_session_id,
                    low_water_mark=info.low_water_mark,
                    local_low_water_mark=info.local_low_water_mark,
                    max_transaction_id=partition.max_transaction_id,
                    corrupt_transaction_id=-1 if corruption is None else corruption.transaction_id,
                    last_session_id=info.session_id,
                    local_start=partition.local_start,
                    archived_through=partition.archived_through,
                    retention_policy=policy,
                )

            response.partitions.append(await node.run(pid, status))
        return response


def _peer_identity(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    """The peer's TLS client certificate subject, as ``", certificate CN=..."`` (empty without one)."""
    auth = context.auth_context() or {}
    names = auth.get("x509_subject") or auth.get("x509_common_name") or []
    return ", certificate " + ", ".join(n.decode(errors="replace") for n in names) if names else ""


def _admin_response(request: storage_pb2.AdminRequest, **body: object) -> storage_pb2.AdminResponse:
    return storage_pb2.AdminResponse(seq_num=request.seq_num, partition_id=request.partition_id, **body)  # type: ignore[arg-type]
