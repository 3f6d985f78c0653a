"""Feed entries as tests read them off a raw client stream (docs/protocol.md "Feed entries")."""

from __future__ import annotations

from typing import NamedTuple

from waltz.protocol import client_pb2, common_pb2

__all__ = ["FeedEntry", "feed_entries"]


class FeedEntry(NamedTuple):
    """One entry of a ``FeedEntries`` run: what seed 002's ``FeedData`` says."""

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
