"""The cost of the two wire forms of appends and store batches: a message per transaction, or columns.

The choice it measured: docs/decisions/0002-column-wire-forms.md.

For a run of N transactions of --size bytes with one WRITE lock each, times (best of --repeat,
CPU of this one thread, microseconds per transaction):

- client appends: building N ``AppendRequest`` messages in a ``ClientMessages`` (the form of
  ``docs/protocol.md`` "Append") against one ``AppendRequests`` of packed lists ("Appends", built
  as ``waltz.client.connection`` does), and serializing;
- server parse: reading them back into the server's ``AppendRow`` tuples
  (``AppendRow.from_proto`` per message against ``append_rows``), with the data CRC each append's
  check computes;
- store batch: building the server's storage ``AppendRequest`` with a ``Record`` message per
  transaction against ``RecordColumns``, and serializing;
- storage encode: parsing it on a storage node and encoding the segment records
  (``format.encode_wire_records`` against ``format.column_rows`` + ``encode_wire_rows``).

    .venv/bin/python -m benchmarks.wire_forms [--transactions 150] [--size 200] [--repeat 200]

Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import time
import zlib
from collections.abc import Callable

from waltz.protocol import client_pb2, storage_pb2
from waltz.services.server.appends import AppendRow, append_rows
from waltz.services.storage import format as fmt


def best(repeat: int, count: int, work: Callable[[], object]) -> float:
    """The fastest of ``repeat`` runs of ``work``, in microseconds of thread CPU per transaction."""
    fastest = float("inf")
    for _ in range(repeat):
        started = time.thread_time()
        work()
        fastest = min(fastest, time.thread_time() - started)
    return fastest / count * 1e6


def main() -> None:
    """Parse the command line (``--help``), run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=150, help="Transactions per message (a wave).")
    parser.add_argument("--size", type=int, default=200, help="Bytes of data per transaction.")
    parser.add_argument("--repeat", type=int, default=200, help="Runs of each case; the best counts.")
    args = parser.parse_args()
    n, data = args.transactions, b"x" * args.size
    crc = zlib.crc32(data)

    def client_messages() -> bytes:
        batch = client_pb2.ClientMessages()
        for i in range(n):
            append = batch.messages.add().append
            rid = append.req_id
            rid.client_id, rid.generation, rid.partition_id, rid.seq_num = 5, 3, 0, 1000 + i
            append.client_high_water_mark = 123456
            append.write_lock_hashes.extend((0x12345678,))
            append.header, append.data, append.checksum = 0, data, crc
        return batch.SerializeToString()

    def client_columns() -> bytes:
        seq_nums: list[int] = []
        marks: list[int] = []
        headers: list[int] = []
        datas: list[bytes] = []
        checksums: list[int] = []
        counts: list[int] = []
        hashes: list[int] = []
        for i in range(n):
            seq_nums.append(1000 + i)
            marks.append(123456)
            headers.append(0)
            datas.append(data)
            checksums.append(crc)
            counts.append(1)
            hashes += (0x12345678,)
        batch = client_pb2.ClientMessages()
        rows = batch.messages.add().appends
        rows.client_id, rows.generation, rows.partition_id = 5, 3, 0
        rows.seq_nums.extend(seq_nums)
        rows.client_high_water_marks.extend(marks)
        rows.headers.extend(headers)
        rows.data.extend(datas)
        rows.checksums.extend(checksums)
        rows.write_lock_counts.extend(counts)
        rows.write_lock_hashes.extend(hashes)
        return batch.SerializeToString()

    def parse_messages(raw: bytes) -> list[AppendRow]:
        rows = [AppendRow.from_proto(m.append) for m in client_pb2.ClientMessages.FromString(raw).messages]
        for row in rows:
            zlib.crc32(row.data)
        return rows

    def parse_columns(raw: bytes) -> list[AppendRow]:
        (message,) = client_pb2.ClientMessages.FromString(raw).messages
        rows, _ = append_rows(message.appends)
        for row in rows:
            zlib.crc32(row.data)
        return rows

    def store_records() -> bytes:
        request = storage_pb2.AppendRequest()
        add = request.records.add
        for i in range(n):
            rid = add(transaction_id=1000 + i, header=0, data=data, checksum=crc).req_id
            rid.client_id, rid.generation, rid.partition_id, rid.seq_num = 5, 3, 0, i
        return request.SerializeToString()

    def store_columns() -> bytes:
        client_ids: list[int] = []
        generations: list[int] = []
        seq_nums: list[int] = []
        headers: list[int] = []
        datas: list[bytes] = []
        checksums: list[int] = []
        for i in range(n):
            client_ids.append(5)
            generations.append(3)
            seq_nums.append(i)
            headers.append(0)
            datas.append(data)
            checksums.append(crc)
        request = storage_pb2.AppendRequest()
        columns = request.columns
        columns.first_transaction_id = 1000
        columns.client_ids.extend(client_ids)
        columns.generations.extend(generations)
        columns.seq_nums.extend(seq_nums)
        columns.headers.extend(headers)
        columns.data.extend(datas)
        columns.checksums.extend(checksums)
        return request.SerializeToString()

    def encode(raw: bytes) -> tuple[bytes, list[int]]:
        request = storage_pb2.AppendRequest.FromString(raw)
        if request.HasField("columns"):
            return fmt.encode_wire_rows(fmt.column_rows(request.columns, 0), 1000)
        return fmt.encode_wire_records(request.records, 1000)

    raws = {name: build() for name, build in [("messages", client_messages), ("columns", client_columns)]}
    assert parse_messages(raws["messages"]) == parse_columns(raws["columns"])
    stores = {name: build() for name, build in [("messages", store_records), ("columns", store_columns)]}
    assert encode(stores["messages"]) == encode(stores["columns"])
    cases = [
        ("client appends: build + serialize", client_messages, client_columns),
        (
            "server: parse appends into rows",
            lambda: parse_messages(raws["messages"]),
            lambda: parse_columns(raws["columns"]),
        ),
        ("server store batch: build + serialize", store_records, store_columns),
        (
            "storage node: parse + encode records",
            lambda: encode(stores["messages"]),
            lambda: encode(stores["columns"]),
        ),
    ]
    print(f"{n} transactions of {args.size} B, one WRITE lock each; best of {args.repeat}, µs/transaction")
    print(f"{'step':<40} {'a message each':>15} {'columns':>9}")
    for name, as_messages, as_columns in cases:
        messages, columns = best(args.repeat, n, as_messages), best(args.repeat, n, as_columns)
        print(f"{name:<40} {messages:>15.2f} {columns:>9.2f}")


if __name__ == "__main__":
    main()
