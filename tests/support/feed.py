"""Feed entries as tests read them off a raw client stream (docs/protocol.md "Feed entries")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from waltz.protocol import client_pb2, common_pb2

__all__ = ["FeedEntry", "feed_entries", "feed_run"]


class _ReqIdLike(Protocol):
    """A ReqId, protobuf or ``waltz.protocol.records.ReqId``."""

    @property
    def client_id(self) -> int: ...
    @property
    def generation(self) -> int: ...
    @property
    def seq_num(self) -> int: ...


class FeedEntry(NamedTuple):
    """One entry of a ``FeedEntries`` run: what docs/design/server.md "Mount and feed" says."""

    req_id: common_pb2.ReqId
    transaction_id: int
    header: int


def feed_entries(run: client_pb2.FeedEntries) -> list[FeedEntry]:
    """The entries of a run, in order (its columns must have the same length)."""
    columns = (run.client_ids, run.generations, run.seq_nums, run.headers)
    assert len({len(column) for column in columns}) == 1, f"columns of different lengths: {run}"
    return [
        FeedEntry(
            common_pb2.ReqId(
                client_id=client_id, generation=generation, partition_id=run.partition_id, seq_num=seq_num
            ),
            run.first_transaction_id + index,
            header,
        )
        for index, (client_id, generation, seq_num, header) in enumerate(zip(*columns, strict=True))
    ]


def feed_run(
    first: int, req_ids: Sequence[_ReqIdLike], headers: Sequence[int] | None = None, partition_id: int = 0
) -> client_pb2.FeedEntries:
    """A run of feed entries as a server sends it: transactions ``first``, ``first + 1``, ...
    appended as ``req_ids``, with ``headers`` (default 0 each)."""
    return client_pb2.FeedEntries(
        partition_id=partition_id,
        first_transaction_id=first,
        client_ids=[r.client_id for r in req_ids],
        generations=[r.generation for r in req_ids],
        seq_nums=[r.seq_num for r in req_ids],
        headers=list(headers) if headers is not None else [0] * len(req_ids),
    )
