"""The transaction monitor (docs/design/client.md "Failed-append detection")."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz.client.monitor import TransactionMonitor
from waltz.protocol.records import ReqId


def rid(seq: int, client: int = 1, generation: int = 3, partition: int = 0) -> ReqId:
    return ReqId(client, generation, partition, seq)


def test_feed_entry_succeeds_its_append_and_fails_the_older_ones() -> None:
    monitor: TransactionMonitor[str] = TransactionMonitor()
    for seq in (1, 2, 5, 7):
        monitor.register(rid(seq), f"a{seq}")
    succeeded, failed = monitor.on_feed(rid(5))
    assert succeeded == "a5"
    assert failed == ["a1", "a2"]  # older pending appends failed, oldest first
    assert len(monitor) == 1
    assert monitor.fail_all() == ["a7"]


def test_entries_of_other_clients_or_generations_are_ignored() -> None:
    monitor: TransactionMonitor[str] = TransactionMonitor()
    monitor.register(rid(1), "a1")
    monitor.register(rid(2), "a2")
    assert monitor.on_feed(rid(2, client=9)) == (None, ())
    assert monitor.on_feed(rid(2, generation=4)) == (None, ())  # same seq, another ReqId
    assert monitor.on_feed(rid(3)) == (None, ())
    assert len(monitor) == 2


def test_an_entry_seen_twice_is_ignored_the_second_time() -> None:
    monitor: TransactionMonitor[str] = TransactionMonitor()
    monitor.register(rid(1), "a1")
    assert monitor.on_feed(rid(1)) == ("a1", ())
    assert monitor.on_feed(rid(1)) == (None, ())


def test_lock_failure_removes_only_its_append() -> None:
    monitor: TransactionMonitor[str] = TransactionMonitor()
    monitor.register(rid(1), "a1")
    monitor.register(rid(2), "a2")
    assert monitor.on_lock_failure(rid(2)) == "a2"
    assert monitor.on_lock_failure(rid(2)) is None
    assert monitor.fail_all() == ["a1"]
    assert not monitor


def test_flush_fails_appends_sent_before_it() -> None:
    monitor: TransactionMonitor[str] = TransactionMonitor()
    monitor.register(rid(3), "a3")
    monitor.register(rid(4), "a4")
    flush_position = monitor.position  # a flush request sent now
    monitor.register(rid(9), "a9")
    assert monitor.fail_before(flush_position) == ["a3", "a4"]
    assert monitor.fail_before(flush_position) == []
    assert monitor.fail_all() == ["a9"]


def test_order_is_the_sending_order_even_when_sequence_numbers_wrap() -> None:
    monitor: TransactionMonitor[str] = TransactionMonitor()
    top = (1 << 31) - 1
    monitor.register(rid(top - 1), "old")
    monitor.register(rid(top), "older than the wrapped one")
    monitor.register(rid(1), "wrapped")  # the client's 32-bit sequence number wrapped to 1
    assert monitor.on_feed(rid(1)) == ("wrapped", ["old", "older than the wrapped one"])
    monitor.register(rid(2), "a2")
    with pytest.raises(ValueError, match="is pending"):
        monitor.register(rid(2), "same sequence number")


@given(st.lists(st.booleans(), min_size=1, max_size=60), st.randoms(use_true_random=False))
def test_every_append_resolves_exactly_once(committed: list[bool], rnd: object) -> None:
    """A model of the server: it commits a subset of the appends in the order received; the feed
    shows the committed ones in order, then a mount response fails the rest. Every append must end
    exactly once, as a success iff it was committed."""
    monitor: TransactionMonitor[int] = TransactionMonitor()
    for seq in range(len(committed)):
        monitor.register(rid(seq + 1), seq)
    outcomes: dict[int, bool] = {}

    def record(item: int, success: bool) -> None:
        assert item not in outcomes, f"append {item} resolved twice"
        outcomes[item] = success

    for seq, was_committed in enumerate(committed):
        if was_committed:
            succeeded, failed = monitor.on_feed(rid(seq + 1))
            assert succeeded == seq
            record(seq, True)
            for item in failed:
                record(item, False)
    for item in monitor.fail_all():  # the mount response
        record(item, False)
    assert outcomes == dict(enumerate(committed))
