"""What ``submit`` resolves to (docs/design/client.md "Outcomes"), and ``ready`` ("Ready to serve"),
on both client APIs against the local cluster."""

from __future__ import annotations

import asyncio

import pytest

from tests.client.client_helpers import Append, MemoryStore
from waltz import (
    AsyncWaltzClient,
    Outcome,
    OutcomeKind,
    TransactionBuilder,
    TransactionContext,
    WaltzClient,
    WaltzClientConfig,
)

TIMEOUT = 30


class Refused(TransactionContext):
    """Dropped by its rule: with a reason, or (``reason`` None) by returning False alone."""

    def __init__(self, partition: int, reason: str | None) -> None:
        super().__init__()
        self.partition = partition
        self.reason = reason
        self.completions: list[bool] = []

    def partition_id(self, num_partitions: int) -> int:
        return self.partition

    def execute(self, builder: TransactionBuilder) -> bool:
        return False if self.reason is None else builder.drop(self.reason)

    def on_completion(self, result: bool) -> None:
        self.completions.append(result)


class SeenBefore(Refused):
    """Finds its request applied before, by transaction ``earlier`` of partition ``earlier_partition``."""

    def __init__(self, partition: int, earlier_partition: int, earlier: int) -> None:
        super().__init__(partition, None)
        self.earlier = (earlier_partition, earlier)

    def execute(self, builder: TransactionBuilder) -> bool:
        return builder.drop_as_applied(*self.earlier)


def _check(committed: Outcome, refused: Outcome, silent: Outcome, seen: Outcome, earlier: int) -> None:
    assert committed.kind is OutcomeKind.COMMITTED and committed.committed and committed
    assert isinstance(committed.transaction_id, int) and committed.partition_id == 1
    assert refused == Outcome(OutcomeKind.DROPPED, 0, None, "insufficient funds")
    assert refused.dropped and not refused
    assert silent == Outcome(OutcomeKind.DROPPED, 1)
    assert seen == Outcome(OutcomeKind.ALREADY_APPLIED, 1, earlier)
    assert seen.already_applied and not seen


def test_each_outcome_on_the_synchronous_client(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    store = MemoryStore(log_start)
    with WaltzClient(store, client_config) as client:
        committed = client.submit(Append(1, b"an outcome")).result(TIMEOUT)
        assert committed.transaction_id is not None
        refused_context = Refused(0, "insufficient funds")
        refused = client.submit(refused_context).result(TIMEOUT)
        silent = client.submit(Refused(1, None)).result(TIMEOUT)
        seen = client.submit(SeenBefore(0, 1, committed.transaction_id)).result(TIMEOUT)
    _check(committed, refused, silent, seen, committed.transaction_id)
    assert refused_context.completions == [False]


class Index:
    """An integer that is not an ``int``, as numpy's are (``operator.index`` gives its value)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


def test_waiting_for_an_outcome_that_did_not_commit_says_so(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    """A dropped outcome has no transaction ID: waiting for its None is refused with a message
    that says to check the outcome, on both client APIs (not a comparison error from deep
    inside); a string is refused, an integer of another type is taken."""
    store = MemoryStore(log_start)
    with WaltzClient(store, client_config) as client:
        committed = client.submit(Append(0, b"waited for")).result(TIMEOUT)
        assert committed.transaction_id is not None
        dropped = client.submit(Refused(0, "insufficient funds")).result(TIMEOUT)
        assert dropped.transaction_id is None
        with pytest.raises(TypeError, match="a dropped outcome has no transaction to wait for"):
            client.wait_applied(0, dropped.transaction_id, timeout=1)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="a dropped outcome has no transaction to wait for"):
            client.when_applied(0, dropped.transaction_id, lambda: None)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="must be an integer"):
            client.wait_applied(0, "3", timeout=1)  # type: ignore[arg-type]
        # Any integer type is an ID (numpy's, for instance): what the wait compares is its value.
        waited = Index(committed.transaction_id)
        assert client.wait_applied(committed.partition_id, waited, timeout=TIMEOUT)  # type: ignore[arg-type]

    async def main() -> None:
        async with AsyncWaltzClient(store, client_config) as aio:
            with pytest.raises(TypeError, match="a dropped outcome has no transaction to wait for"):
                await aio.wait_applied(0, None, timeout=1)  # type: ignore[arg-type]

    asyncio.run(main())


def test_each_outcome_on_the_asyncio_client(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    store = MemoryStore(log_start)

    async def main() -> tuple[Outcome, ...]:
        async with AsyncWaltzClient(store, client_config) as client:
            committed = await client.submit_async(Append(1, b"an async outcome"))
            assert committed.transaction_id is not None
            refused = await (await client.submit(Refused(0, "insufficient funds")))
            silent = await client.submit_async(Refused(1, None))
            seen = await client.submit_async(SeenBefore(0, 1, committed.transaction_id))
            return committed, refused, silent, seen

    committed, refused, silent, seen = asyncio.run(main())
    assert committed.transaction_id is not None
    _check(committed, refused, silent, seen, committed.transaction_id)


@pytest.mark.parametrize("api", ["sync", "asyncio"])
def test_ready_returns_once_every_mounted_partition_applied_the_log(
    api: str, client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    with WaltzClient(MemoryStore(log_start), client_config) as writer:
        written = [writer.submit(Append(i % 2, b"before %d" % i)).result(TIMEOUT) for i in range(40)]
    last = {pid: max(o.transaction_id or -1 for o in written if o.partition_id == pid) for pid in (0, 1)}
    store = MemoryStore(log_start)  # a new instance, behind by those 40 transactions

    if api == "sync":
        with WaltzClient(store, client_config) as client:
            marks = client.ready(TIMEOUT)
            applied = {pid: store.get_client_high_water_mark(pid) for pid in (0, 1)}
    else:

        async def main() -> tuple[dict[int, int], dict[int, int]]:
            async with AsyncWaltzClient(store, client_config) as client:
                marks = await client.ready(TIMEOUT)
                return marks, {pid: store.get_client_high_water_mark(pid) for pid in (0, 1)}

        marks, applied = asyncio.run(main())
    for pid in (0, 1):
        assert marks[pid] >= last[pid], (pid, marks, last)
        assert applied[pid] >= marks[pid], f"ready() returned with partition {pid} at {applied} of {marks}"
    assert store.errors == []
