"""Wrong values from an application fail its own call or its own context, with a clear error, and
never the connection that the other partitions' appends share (docs/design/client.md
"Transaction contexts and callbacks"): a real local cluster, a real client."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable

import pytest

from tests.client.client_helpers import Append, MemoryStore
from waltz import (
    BytesSerializer,
    PartitionLocalLock,
    TransactionBuilder,
    TransactionContext,
    WaltzClient,
    WaltzClientConfig,
)
from waltz.client.mount_procedure import PartitionState
from waltz.errors import WaltzTimeoutError

BAD_VALUES = [
    pytest.param({"header": 1.5}, "transaction header must be an int", id="float header"),
    pytest.param({"header": 0.0}, "transaction header must be an int", id="zero float header"),
    pytest.param({"header": True}, "transaction header must be an int", id="bool header"),
    pytest.param({"high_water_mark": 1.5}, "client high-water mark must be an int", id="float mark"),
    pytest.param(
        {"high_water_mark": 2**63}, "does not fit in a signed 64-bit integer", id="mark past 64 bits"
    ),
    pytest.param({"data": 5}, "transaction data must be bytes-like", id="int data"),
    pytest.param({"data": "text"}, "transaction data must be bytes-like", id="str data"),
]


@pytest.mark.parametrize(("fields", "error"), BAD_VALUES)
def test_a_context_with_a_wrong_value_fails_alone_and_the_others_commit(
    client_config: WaltzClientConfig, log_start: dict[int, int], fields: dict[str, object], error: str
) -> None:
    store = MemoryStore(log_start)
    values: dict[str, object] = {"data": b"bad"} | fields
    data = values.pop("data")
    bad = Append(0, data, **values)  # type: ignore[arg-type]
    with WaltzClient(store, client_config) as client:
        client.wait_mounted(30)
        good_before = [client.submit(Append(pid, b"before")) for pid in (0, 1)]
        future = client.submit(bad)
        good_after = [client.submit(Append(pid, f"after {i}".encode())) for i in range(20) for pid in (0, 1)]
        with pytest.raises(TypeError if "must be" in error else ValueError, match=error.replace("*", r"\*")):
            future.result(10)
        assert bad.outcomes.executions == 1  # failed at once, not retried forever
        for good in good_before + good_after:
            assert good.result(30).committed
        client.flush(10)
        assert client.partition_states() == {0: PartitionState.MOUNTED, 1: PartitionState.MOUNTED}
        for pid in (0, 1):
            remounts = client.metrics.get_sample_value("waltz_client_remounts_total", {"partition": str(pid)})
            assert not remounts, f"partition {pid} mounted again {remounts} time(s)"


class ChooseWrongly(TransactionContext):
    """A context whose ``partition_id`` returns ``choice``."""

    def __init__(self, choice: object, timeout: float | None = None) -> None:
        super().__init__(timeout=timeout)
        self.choice = choice

    def partition_id(self, num_partitions: int) -> int:
        return self.choice  # type: ignore[return-value]

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_raw_data(b"never")
        return True


@pytest.mark.parametrize("choice", [0.5, "0", 1.0, True, None])
def test_a_partition_that_is_not_an_int_is_refused_by_submit(
    client_config: WaltzClientConfig, log_start: dict[int, int], choice: object
) -> None:
    with WaltzClient(MemoryStore(log_start), client_config) as client:
        with pytest.raises(TypeError, match=r"ChooseWrongly\.partition_id's result must be an int"):
            client.submit(ChooseWrongly(choice))
        assert not client.has_pending_transactions()


def test_lock_ids_and_names_of_the_wrong_type_are_refused_where_they_are_made() -> None:
    with pytest.raises(TypeError, match=r"lock ID of 'a' must be an int, not float 1\.5"):
        PartitionLocalLock("a", 1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="lock name must be a str"):
        PartitionLocalLock(b"a", 1)  # type: ignore[arg-type]
    assert PartitionLocalLock("a", 7) == PartitionLocalLock("a", 7)


def test_bytes_like_data_is_copied_and_anything_else_refused() -> None:
    builder = TransactionBuilder(-1)
    builder.set_raw_data(bytearray(b"ab"))
    assert builder.data == b"ab" and type(builder.data) is bytes
    builder.set_raw_data(memoryview(b"cd"))
    assert builder.data == b"cd"
    with pytest.raises(TypeError, match="transaction data must be bytes-like"):
        builder.set_raw_data(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be bytes-like"):
        BytesSerializer().serialize(3)  # type: ignore[arg-type]


class MarkOf(MemoryStore):
    """Callbacks whose ``get_client_high_water_mark`` returns ``mark`` (None: a missing row)."""

    def __init__(self, start: dict[int, int], mark: object) -> None:
        super().__init__(start)
        self.mark = mark
        self.reported: list[BaseException] = []

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return self.mark  # type: ignore[return-value]

    def uncaught_exception(self, partition_id: int, transaction_id: int, exception: BaseException) -> None:
        self.reported.append(exception)


def test_a_mark_callback_that_returns_none_is_reported_and_logged_not_silent(
    client_config: WaltzClientConfig, log_start: dict[int, int], caplog: pytest.LogCaptureFixture
) -> None:
    store = MarkOf(log_start, None)
    caplog.set_level(logging.WARNING, logger="waltz.client")
    with WaltzClient(store, client_config) as client:
        with pytest.raises(WaltzTimeoutError):
            client.wait_mounted(2)
        assert store.reported, "the application was not told"
        assert re.fullmatch(
            r"the mark get_client_high_water_mark\([01]\) returned must be an int, not NoneType None",
            str(store.reported[0]),
        )
        assert any("get_client_high_water_mark" in r.getMessage() for r in caplog.records)
        # The row is back (one mark for both partitions: at or below each one's high-water mark,
        # which a server refuses a mark above): the next mount attempt succeeds.
        store.mark = min(log_start.values())
        client.wait_mounted(30)


def test_wait_mounted_with_no_time_answers_from_the_state_and_names_unknown_partitions(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    with WaltzClient(MemoryStore(log_start), client_config) as client:
        client.wait_mounted(30)
        client.wait_mounted(0)
        client.wait_mounted(0, [1])
        with pytest.raises(ValueError, match=r"partitions \[9\] do not exist"):
            client.wait_mounted(1, [9])


@pytest.mark.parametrize("timeout", [-1, math.nan, math.inf])
def test_timeouts_that_are_not_zero_or_more_finite_seconds_are_refused(
    client_config: WaltzClientConfig, log_start: dict[int, int], timeout: float
) -> None:
    """The error says what to give, and offers None (no limit) only to the calls that take it:
    ``ready``, ``wait_mounted`` and ``get_high_water_mark`` refuse None."""
    with WaltzClient(MemoryStore(log_start), client_config) as client:
        unbounded: dict[str, Callable[[], object]] = {
            "flush": lambda: client.flush(timeout),
            "wait_applied": lambda: client.wait_applied(0, 0, timeout),
        }
        bounded: dict[str, Callable[[], object]] = {
            "get_high_water_mark": lambda: client.get_high_water_mark(0, timeout),
            "ready": lambda: client.ready(timeout),
            "wait_mounted": lambda: client.wait_mounted(timeout),
        }
        for name, call in unbounded.items():
            with pytest.raises(ValueError, match=f"{name} timeout of .* or None for no limit"):
                call()
        for name, call in bounded.items():
            with pytest.raises(ValueError, match=f"{name} timeout of .* give zero or more finite") as refused:
                call()
            assert "None" not in str(refused.value), refused.value
        for name in bounded:
            with pytest.raises(TypeError, match=f"{name} timeout must be seconds .*no unbounded form"):
                getattr(client, name)(*([0] if name == "get_high_water_mark" else []), None)
    for bad in (0, timeout):
        with pytest.raises(ValueError, match="context timeout"):
            ChooseWrongly(0, timeout=bad)


class Interrupted(Append):
    """A context whose ``execute`` is interrupted (Ctrl-C)."""

    def execute(self, builder: TransactionBuilder) -> bool:
        raise KeyboardInterrupt


def test_an_interrupted_execute_ends_its_context_and_frees_its_slot(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    with WaltzClient(MemoryStore(log_start), client_config) as client:
        with pytest.raises(KeyboardInterrupt):
            client.submit(Interrupted(0, b"x"))
        assert not client.has_pending_transactions()
        client.flush(5)
        assert client.submit(Append(0, b"y")).result(30).committed
