"""A client of the server admin protocol (status, store-level appends and reads).

Tools, tests and benchmarks use it; applications use the Waltz client instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from waltz.protocol import server_pb2, server_pb2_grpc
from waltz.protocol.channels import TlsConfig, open_channel
from waltz.protocol.records import Record, ReqId

__all__ = ["ServerAdminClient"]


class ServerAdminClient:
    """An admin connection to one server; use as an async context manager.

    gRPC errors are raised as :class:`grpc.aio.AioRpcError`: ``FAILED_PRECONDITION`` when the
    partition is not on this server, ``UNAVAILABLE`` when the server is down.
    """

    def __init__(self, endpoint: str, *, tls: TlsConfig | None = None, timeout: float = 30.0) -> None:
        self.endpoint = endpoint
        self._timeout = timeout
        self._channel = open_channel(endpoint, tls)
        self._stub = server_pb2_grpc.ServerAdminServiceStub(self._channel)

    async def __aenter__(self) -> ServerAdminClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close(None)

    async def status(self) -> server_pb2.ServerStatusResponse:
        """The server's member name, role and partitions."""
        return await self._stub.Status(server_pb2.ServerStatusRequest(), timeout=self._timeout)

    async def append(
        self, partition_id: int, transactions: Sequence[tuple[ReqId, int, bytes]]
    ) -> list[int | str]:
        """Append transactions ``(req_id, header, data)``; returns each one's transaction ID or error."""
        response = await self._stub.AppendRecords(
            server_pb2.AppendRecordsRequest(
                partition_id=partition_id,
                transactions=[
                    server_pb2.TransactionInput(req_id=r.to_proto(), header=h, data=d)
                    for r, h, d in transactions
                ],
            ),
            timeout=self._timeout,
        )
        return [o.transaction_id if o.transaction_id >= 0 else o.error for o in response.outcomes]

    async def read(self, partition_id: int, transaction_id: int, max_records: int) -> list[Record]:
        """Read committed records from ``transaction_id`` on."""
        response = await self._stub.ReadRecords(
            server_pb2.ReadRecordsRequest(
                partition_id=partition_id, transaction_id=transaction_id, max_records=max_records
            ),
            timeout=self._timeout,
        )
        return [Record.from_proto(r) for r in response.records]
