"""The storage client's hand-made wire bytes parse as the messages they stand for.

A server serializes each append batch once for all its replicas and frames queued requests into
stream messages itself (``waltz/protocol/storage_client.py``); protobuf must read those bytes back
as exactly the ``StorageRequest`` / ``StorageRequests`` built the usual way.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from waltz.protocol import common_pb2, storage_pb2
from waltz.protocol.storage_client import append_request, frame_requests

ints64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
ints32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)

records = st.builds(
    common_pb2.Record,
    transaction_id=ints64,
    req_id=st.builds(
        common_pb2.ReqId, client_id=ints32, generation=ints32, partition_id=ints32, seq_num=ints32
    ),
    header=ints32,
    data=st.binary(max_size=300),
    checksum=st.integers(min_value=0, max_value=2**32 - 1),
)
appends = st.lists(records, max_size=20).map(lambda rs: storage_pb2.AppendRequest(records=rs))


@settings(max_examples=200, deadline=None)
@given(session_id=ints64, seq_num=ints64, partition_id=ints32, append=appends)
def test_an_append_request_from_its_serialized_body(
    session_id: int, seq_num: int, partition_id: int, append: storage_pb2.AppendRequest
) -> None:
    expected = storage_pb2.StorageRequest(
        session_id=session_id, seq_num=seq_num, partition_id=partition_id, append=append
    )
    made = storage_pb2.StorageRequest.FromString(
        append_request(session_id, seq_num, partition_id, append.SerializeToString())
    )
    assert made == expected
    assert made.WhichOneof("body") == "append"


requests = st.one_of(
    st.builds(
        lambda s, q, p, a: storage_pb2.StorageRequest(session_id=s, seq_num=q, partition_id=p, append=a),
        ints64,
        ints64,
        ints32,
        appends,
    ),
    st.builds(
        lambda s, q, p, t: storage_pb2.StorageRequest(
            session_id=s, seq_num=q, partition_id=p, truncate=storage_pb2.TruncateRequest(transaction_id=t)
        ),
        ints64,
        ints64,
        ints32,
        ints64,
    ),
)


@settings(max_examples=200, deadline=None)
@given(batch=st.lists(requests, max_size=10))
def test_framed_requests_are_the_stream_message_of_those_requests(
    batch: list[storage_pb2.StorageRequest],
) -> None:
    framed = frame_requests([r.SerializeToString() for r in batch])
    assert storage_pb2.StorageRequests.FromString(framed) == storage_pb2.StorageRequests(requests=batch)
