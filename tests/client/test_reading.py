"""``read_up_to`` (a fresh client reading the log up to known marks) on a cluster: it applies every
transaction once, in order, and a long read reports its progress while it goes on."""

from __future__ import annotations

import time

import pytest

from tests.client.client_helpers import Append, MemoryStore, PrefetchingStore
from waltz import Transaction, WaltzClient, WaltzClientConfig
from waltz.client import reading
from waltz.client.reading import read_up_to
from waltz.errors import TransactionDataError
from waltz.local.cluster import LocalCluster

TIMEOUT = 60.0
COUNT = 30


class SlowStore(MemoryStore):
    """A :class:`MemoryStore` that takes 20 ms per apply (a read long enough to report on)."""

    def apply_transaction(self, transaction: Transaction) -> None:
        time.sleep(0.02)
        super().apply_transaction(transaction)


def test_a_long_read_reports_its_progress_until_done(
    cluster: LocalCluster,
    client_config: WaltzClientConfig,
    log_start: dict[int, int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with WaltzClient(MemoryStore(log_start), client_config) as writer:
        ids = [
            writer.submit(Append(0, f"read {i}".encode())).result(TIMEOUT).transaction_id
            for i in range(COUNT)
        ]
    assert all(i is not None for i in ids)
    marks = dict(log_start)
    marks[0] = max(i for i in ids if i is not None)
    monkeypatch.setattr(reading, "PROGRESS_INTERVAL", 0.05)
    reports: list[tuple[int, int]] = []
    reader = SlowStore(log_start)
    read_up_to(
        reader,
        WaltzClientConfig(**cluster.client_settings()),
        marks,
        timeout=TIMEOUT,
        progress=lambda done, total: reports.append((done, total)),
    )
    total = sum(mark + 1 for mark in marks.values() if mark >= 0)
    # 30 applies of 20 ms against reports every 50 ms: several reports, each of a read not done yet.
    assert len(reports) >= 3, reports
    assert {t for _, t in reports} == {total}
    done = [d for d, _ in reports]
    assert done == sorted(done) and done[-1] < total, reports
    assert done[-1] > done[0], f"no progress between reports: {reports}"
    assert reader.marks == marks
    assert [a.transaction_id for a in reader.applied[0]] == list(range(log_start[0] + 1, marks[0] + 1))
    assert reader.errors == []


def test_a_reader_fetches_batches_of_large_transactions_in_pages(
    cluster: LocalCluster, client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    """Apply batches whose data exceeds one GetTransactionDataRange answer (4 MiB) arrive whole."""
    datas = [bytes([i]) * (300 * 1024) if i % 3 else f"small {i}".encode() for i in range(40)]
    with WaltzClient(MemoryStore(log_start), client_config) as writer:
        ids = [writer.submit(Append(0, data)).result(TIMEOUT).transaction_id for data in datas]
        assert ids == list(range(log_start[0] + 1, log_start[0] + 1 + len(datas)))
        # The data client itself: 7.6 MiB of consecutive transactions (two answers at least), and
        # runs with gaps between them (fetched concurrently), each in the order asked.
        fetcher = writer._core.data_client
        assert fetcher.fetch_many(0, list(ids)) == datas
        assert fetcher.fetch_many(0, ids[::2]) == datas[::2]
        assert fetcher.fetch_many(0, [ids[5], ids[6], ids[30]]) == [datas[5], datas[6], datas[30]]
        assert fetcher.fetch(0, ids[-1]) == datas[-1]
    marks = dict(log_start)
    marks[0] = log_start[0] + len(datas)
    reader = PrefetchingStore(dict(log_start))
    read_up_to(reader, WaltzClientConfig(**cluster.client_settings()), marks, timeout=TIMEOUT)
    assert reader.errors == []
    assert [a.data for a in reader.applied[0]] == datas
    assert reader.loaded_before_apply and all(reader.loaded_before_apply)


def test_a_fetch_that_cannot_finish_fails_with_a_transaction_data_error(
    cluster: LocalCluster, client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    """Pages that arrive, then one that never can (not committed): the whole fetch ends at
    ``client.transactionDataTimeout`` with the error naming that transaction, not a bare timeout."""
    config = client_config.model_copy(update={"client_transaction_data_timeout": 1.0})
    datas = [bytes([i]) * (300 * 1024) for i in range(16)]  # 4.7 MiB: two answers
    with WaltzClient(MemoryStore(log_start), config) as writer:
        ids = [writer.submit(Append(0, data)).result(TIMEOUT).transaction_id for data in datas]
        fetcher = writer._core.data_client
        beyond = ids[-1] + 1  # the next transaction: not committed
        with pytest.raises(TransactionDataError) as info:
            fetcher.fetch_many(0, [*ids, beyond])
        assert (info.value.partition_id, info.value.transaction_id) == (0, beyond)
        assert "client.transactionDataTimeout" in str(info.value)
        assert fetcher.fetch_many(0, ids[-2:]) == datas[-2:]  # the client still fetches
