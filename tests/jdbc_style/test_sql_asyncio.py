"""The SQL framework on asyncio (docs/design/sql.md "The SQL framework on asyncio"): entity contexts'
outcomes on both client APIs, the ``await`` twins, the refusal of asyncio engines, and an event
loop that never waits for a database snapshot.

The session's log is shared with other tests and each database is fresh: the callbacks pass over
what is not this module's (as in ``test_sql_entities_cluster``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import support
from sqlalchemy import BigInteger, Engine, event, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from support.loop_probe import LoopProbeReport, loop_probe

from waltz import AsyncWaltzClient, Outcome, OutcomeKind, Transaction, WaltzClient, WaltzClientConfig
from waltz.errors import AsyncCallbackError, AsyncClientError, AsyncEngineError
from waltz.jdbc_style import (
    AppliedRequest,
    ChangeSetCallbacks,
    EntityBatcher,
    EntityRegistry,
    EntityTransaction,
    EntityTransactionContext,
    RowChange,
    WaltzEntity,
    create_framework_engine,
    prepare_engine,
    skips,
)
from waltz.local.cluster import LocalCluster

#: Seconds a test waits for one outcome (a future, a mark).
TIMEOUT = 60

#: The backends these tests run on (``app_db_url``'s parameters).
BACKENDS = ["sqlite", "postgresql"]


class Base(DeclarativeBase):
    pass


class Wallet(Base):
    __tablename__ = "asyncio_wallets"
    __waltz__ = WaltzEntity("asyncio_wallet")

    wallet_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    balance: Mapped[int] = mapped_column(BigInteger, nullable=False)


class SharedLogCallbacks(ChangeSetCallbacks):
    """Passes over the transactions of other tests on the session's log."""

    def apply_command(self, transaction: Transaction, session: Session) -> None:
        return None

    def apply_change(self, change: RowChange, session: Session, transaction: Transaction) -> None:
        if change.entity in {info.name for info in self.registry}:
            super().apply_change(change, session, transaction)


class Open(EntityTransactionContext):
    """Opens a wallet; dropped, with a reason, when it exists."""

    def __init__(self, callbacks: ChangeSetCallbacks, wallet_id: int, balance: int) -> None:
        super().__init__(callbacks, (Wallet, wallet_id))
        self.wallet_id, self.balance = wallet_id, balance

    def run(self, tx: EntityTransaction) -> bool:
        if tx.get(Wallet, self.wallet_id) is not None:
            return tx.drop(f"wallet {self.wallet_id} exists")
        tx.insert(Wallet, wallet_id=self.wallet_id, balance=self.balance)
        return True


class Spend(EntityTransactionContext):
    """Takes ``amount`` from a wallet, once per request key; dropped when the balance is short.

    Args:
        slow_read: seconds of a database read in ``run`` besides the wallet's (PostgreSQL only),
            as a service's query over more rows would take.
    """

    def __init__(
        self,
        callbacks: ChangeSetCallbacks,
        wallet_id: int,
        amount: int,
        request_key: str | None = None,
        slow_read: float = 0.0,
    ) -> None:
        super().__init__(callbacks, (Wallet, wallet_id))
        self.wallet_id, self.amount, self.request_key, self.slow_read = (
            wallet_id,
            amount,
            request_key,
            slow_read,
        )

    def run(self, tx: EntityTransaction) -> bool:
        if self.slow_read:
            tx.session.execute(text("SELECT pg_sleep(:seconds)"), {"seconds": self.slow_read})
        wallet = tx.get(Wallet, self.wallet_id)
        if wallet is None or wallet.balance < self.amount:
            return tx.drop(f"insufficient funds in wallet {self.wallet_id}")
        tx.idempotency_key = self.request_key
        tx.update(wallet, balance=wallet.balance - self.amount)
        return True


@dataclass
class App:
    """One instance's engine and callbacks, and the client configuration of the cluster."""

    engine: Engine
    callbacks: SharedLogCallbacks
    config: WaltzClientConfig
    rng: random.Random

    def wallet_id(self) -> int:
        return self.rng.randrange(1, 1 << 62)


def _app(cluster: LocalCluster, url: str, entity_cache: bool = True) -> Iterator[App]:
    setup = create_framework_engine(url)
    try:
        Base.metadata.create_all(setup)
    finally:
        setup.dispose()
    engine = create_framework_engine(url)
    try:
        callbacks = SharedLogCallbacks(
            engine,
            cluster_name=f"asyncio-{support.unique_suffix()}",
            registry=EntityRegistry.from_base(Base),
            entity_cache=entity_cache,
        )
        config = WaltzClientConfig(
            **cluster.client_settings(),
            zookeeper_session_timeout=10.0,
        )
        yield App(engine, callbacks, config, random.Random())
        assert callbacks.uncaught_count == 0, list(callbacks.uncaught)
    finally:
        engine.dispose()


@pytest.fixture
def app(sql_cluster_ready: LocalCluster, app_db_url: str) -> Iterator[App]:
    """An instance on a fresh database (the backend of ``app_db_url``), with the entity cache."""
    yield from _app(sql_cluster_ready, app_db_url)


def _check_outcomes(
    opened: Outcome, again: Outcome, spent: Outcome, repeated: Outcome, refused: Outcome, partition: int
) -> None:
    assert opened.committed and opened.partition_id == partition and isinstance(opened.transaction_id, int)
    assert again.kind is OutcomeKind.DROPPED and again.reason is not None and "exists" in again.reason
    assert spent.committed and spent.partition_id == partition
    assert repeated == Outcome(OutcomeKind.ALREADY_APPLIED, partition, spent.transaction_id)
    assert not repeated
    assert refused.dropped and refused.reason is not None and "insufficient funds" in refused.reason


@pytest.mark.parametrize("app_db_url", BACKENDS, indirect=True)
def test_entity_outcomes_on_the_synchronous_client(app: App) -> None:
    callbacks, wallet = app.callbacks, app.wallet_id()
    with WaltzClient(callbacks, app.config) as client:
        opened = client.submit(Open(callbacks, wallet, 100)).result(TIMEOUT)
        again = client.submit(Open(callbacks, wallet, 100)).result(TIMEOUT)
        spend = Spend(callbacks, wallet, 30, request_key=f"spend-{wallet}")
        spent = client.submit(spend).result(TIMEOUT)
        assert spent.transaction_id is not None
        assert callbacks.wait_for(spent.partition_id, spent.transaction_id, TIMEOUT)
        repeated = client.submit(Spend(callbacks, wallet, 30, request_key=f"spend-{wallet}")).result(TIMEOUT)
        refused = client.submit(Spend(callbacks, wallet, 1_000)).result(TIMEOUT)
        read = callbacks.read_entities([(Wallet, wallet)], num_partitions=client.num_partitions)
    _check_outcomes(opened, again, spent, repeated, refused, spend.chosen_partition)
    assert read.entities[0].balance == 70  # the repeated request changed nothing


@pytest.mark.parametrize("app_db_url", BACKENDS, indirect=True)
def test_entity_outcomes_and_await_twins_on_the_asyncio_client(app: App) -> None:
    callbacks, wallet = app.callbacks, app.wallet_id()
    key = f"spend-{wallet}"

    async def main() -> None:
        async with AsyncWaltzClient(callbacks, app.config) as client:
            await client.ready(TIMEOUT)
            opened = await client.submit_async(Open(callbacks, wallet, 100))
            again = await client.submit_async(Open(callbacks, wallet, 100))
            spend = Spend(callbacks, wallet, 30, request_key=key)
            spent = await client.submit_async(spend)
            assert spent.transaction_id is not None
            pid = spent.partition_id
            assert await callbacks.find_idempotency_key_async(key) in (
                None,
                AppliedRequest(pid, spent.transaction_id),
            )
            read = await callbacks.read_entities_async(
                [(Wallet, wallet)], num_partitions=client.num_partitions, after=spent.transaction_id
            )
            assert read.high_water_mark >= spent.transaction_id and read.entities[0].balance == 70
            assert await callbacks.wait_for_async(pid, spent.transaction_id, TIMEOUT)
            assert await callbacks.find_idempotency_key_async(key) == AppliedRequest(
                pid, spent.transaction_id
            )
            assert await callbacks.find_idempotency_key_async(f"never-{wallet}") is None
            assert not await callbacks.wait_for_async(pid, spent.transaction_id + 1_000_000, 0.3)
            repeated = await client.submit_async(Spend(callbacks, wallet, 30, request_key=key))
            refused = await client.submit_async(Spend(callbacks, wallet, 1_000))
            _check_outcomes(opened, again, spent, repeated, refused, spend.chosen_partition)

    asyncio.run(main())


@pytest.mark.parametrize("app_db_url", BACKENDS, indirect=True)
def test_read_entities_async_waits_for_another_instance_s_apply(
    app: App, sql_cluster_ready: LocalCluster
) -> None:
    """A read ``after`` a transaction another instance committed, on a database this instance applies
    too: the coroutine waits (on the framework's threads or its own applies), never the loop."""
    callbacks, wallet = app.callbacks, app.wallet_id()

    async def main() -> None:
        async with AsyncWaltzClient(callbacks, app.config) as reader:
            with WaltzClient(callbacks, app.config) as writer:
                opened = writer.submit(Open(callbacks, wallet, 5)).result(TIMEOUT)
                assert opened.transaction_id is not None
                read = await callbacks.read_entities_async(
                    [(Wallet, wallet)], num_partitions=reader.num_partitions, after=opened.transaction_id
                )
        assert read.entities[0].balance == 5 and read.high_water_mark >= opened.transaction_id

    asyncio.run(main())


def test_asyncio_urls_are_refused_with_the_synchronous_url() -> None:
    url = "postgresql+psycopg_async://app:secret@127.0.0.1:5432/app"
    with pytest.raises(
        AsyncEngineError, match=r"postgresql\+psycopg://app:\*\*\*@127.0.0.1:5432/app"
    ) as raised:
        create_framework_engine(url)
    assert raised.value.sync_url == "postgresql+psycopg://app:***@127.0.0.1:5432/app"
    assert isinstance(raised.value, TypeError)
    with pytest.raises(AsyncEngineError, match=r"'sqlite:///app.db'"):
        create_framework_engine("sqlite+aiosqlite:///app.db")
    with pytest.raises(AsyncEngineError, match=r"'mysql\+pymysql://root@db/app'"):
        create_framework_engine("mysql+aiomysql://root@db/app")


def test_an_async_engine_is_refused_with_the_synchronous_url() -> None:
    pytest.importorskip(
        "greenlet", reason="SQLAlchemy's asyncio extension needs greenlet (the dev extra has it)"
    )
    from sqlalchemy.ext.asyncio import create_async_engine

    async_engine = create_async_engine("postgresql+psycopg_async://app:secret@127.0.0.1:5432/app")
    try:
        registry = EntityRegistry.from_base(Base)
        with pytest.raises(AsyncEngineError, match="not an AsyncEngine") as raised:
            ChangeSetCallbacks(async_engine, cluster_name="refused", registry=registry)  # type: ignore[arg-type]
        assert raised.value.sync_url == "postgresql+psycopg://app:***@127.0.0.1:5432/app"
        with pytest.raises(AsyncEngineError, match="asyncio driver postgresql\\+psycopg_async"):
            prepare_engine(async_engine.sync_engine)  # its sync_engine would need greenlet for every call
        # The migrations too (a lifespan's first call), not a TypeError from alembic's set-up.
        from waltz.jdbc_style import migrations_api

        for bind in (async_engine, "sqlite+aiosqlite:///app.db"):
            with pytest.raises(AsyncEngineError, match="synchronous"):
                migrations_api.upgrade(bind)  # type: ignore[arg-type]
            with pytest.raises(AsyncEngineError, match="synchronous"):
                migrations_api.current(bind)  # type: ignore[arg-type]
            # The operators' reads and skip requests too, not greenlet's "await_() here".
            with pytest.raises(AsyncEngineError, match="synchronous"):
                skips.list_marks(bind)  # type: ignore[arg-type]
            with pytest.raises(AsyncEngineError, match="synchronous"):
                skips.list_skips(bind)  # type: ignore[arg-type]
            with pytest.raises(AsyncEngineError, match="synchronous"):
                skips.request_skip(
                    bind,  # type: ignore[arg-type]
                    cluster_name="refused",
                    partition_id=0,
                    transaction_id=0,
                    reason="stuck",
                    operator="alice",
                )
    finally:
        async_engine.sync_engine.dispose()


@pytest.mark.parametrize("app_db_url", ["postgresql"], indirect=True)
def test_an_entity_batcher_refuses_the_asyncio_client_and_says_how_to_batch_on_asyncio(app: App) -> None:
    """``EntityBatcher(async_client)`` failed deep in its set-up (``AttributeError: ... no
    attribute 'config'``); it now says to give it a ``WaltzClient`` and submit from a thread, and
    that way works: concurrent requests on one hot wallet share log transactions, each applied
    once."""
    callbacks, wallet = app.callbacks, app.wallet_id()

    async def refused() -> None:
        async with AsyncWaltzClient(callbacks, app.config) as client:
            with pytest.raises(
                AsyncClientError, match="needs a WaltzClient, not an AsyncWaltzClient"
            ) as raised:
                EntityBatcher(client)  # type: ignore[arg-type]
            assert isinstance(raised.value, TypeError)
            assert "asyncio.to_thread(batcher.submit, context)" in str(raised.value)

    asyncio.run(refused())

    async def batched() -> None:
        client = await asyncio.to_thread(WaltzClient, callbacks, app.config)
        try:
            with EntityBatcher(client) as batcher:

                async def submit(context: EntityTransactionContext) -> Outcome:
                    return await asyncio.wrap_future(await asyncio.to_thread(batcher.submit, context))

                assert (await submit(Open(callbacks, wallet, 100))).committed
                spent = await asyncio.gather(
                    *(submit(Spend(callbacks, wallet, 1, request_key=f"{wallet}-{n}")) for n in range(40))
                )
                assert all(outcome.committed for outcome in spent), spent
                last = max(outcome.transaction_id or 0 for outcome in spent)
                read = await callbacks.read_entities_async(
                    [(Wallet, wallet)], num_partitions=client.num_partitions, after=last, timeout=TIMEOUT
                )
                assert read.entities[0].balance == 60
                again = await submit(Spend(callbacks, wallet, 1, request_key=f"{wallet}-0"))
                assert again.already_applied and again.transaction_id == spent[0].transaction_id
        finally:
            await asyncio.to_thread(client.close)

    asyncio.run(batched())


class _AsyncOpen(Open):
    """:class:`Open` written ``async def run``: a coroutine the framework would never run."""

    async def run(self, tx: EntityTransaction) -> bool:  # type: ignore[override]
        return super().run(tx)


@pytest.mark.parametrize("app_db_url", ["postgresql"], indirect=True)
def test_an_async_def_run_is_refused_naming_it_not_committed_as_nothing(app: App) -> None:
    """An entity context written ``async def run`` returned a coroutine, which counted as True: the
    request was answered committed, with an empty change-set, and its change was lost. It now
    fails with ``AsyncCallbackError`` (a ``TypeError``) that names ``run`` and says to make it a
    plain ``def``; nothing is appended."""
    callbacks, wallet = app.callbacks, app.wallet_id()

    async def main() -> None:
        async with AsyncWaltzClient(callbacks, app.config) as client:
            with pytest.raises(AsyncCallbackError, match=r"_AsyncOpen\.run returned coroutine") as raised:
                await asyncio.wait_for(client.submit_async(_AsyncOpen(callbacks, wallet, 5)), TIMEOUT)
            assert isinstance(raised.value, TypeError)
            assert "make it a plain def" in str(raised.value)
            opened = await client.submit_async(Open(callbacks, wallet, 7))
            assert opened.committed  # the wallet did not exist: the refused one appended nothing
            read = await callbacks.read_entities_async(
                [(Wallet, wallet)], num_partitions=client.num_partitions, after=opened.transaction_id
            )
            assert read.entities[0].balance == 7

    asyncio.run(main())


@pytest.fixture
def uncached_postgres_app(sql_cluster_ready: LocalCluster, postgres_url: str) -> Iterator[App]:
    """An instance on PostgreSQL without the entity cache: every attempt reads a database snapshot."""
    from waltz.jdbc_style.migrations_api import upgrade

    setup = create_framework_engine(postgres_url)
    try:
        upgrade(setup)
    finally:
        setup.dispose()
    yield from _app(sql_cluster_ready, postgres_url, entity_cache=False)


def test_entity_snapshots_never_run_on_the_event_loop(
    uncached_postgres_app: App,
) -> None:
    """100 concurrent entity requests on the asyncio client, every attempt a cache miss whose
    snapshot reads for 10 ms: no database statement runs on the caller's loop thread.

    A probe times every callback of the loop meanwhile, by wall time and by the loop thread's CPU
    time, with the garbage collector's pauses. Its report is logged as a measurement, not
    asserted: a callback that only sets a future can wait milliseconds for the GIL on a busy
    machine (docs/decisions/0064-entity-attempts-off-the-event-loop.md); the report tells that
    waiting from work."""
    app = uncached_postgres_app
    callbacks = app.callbacks
    wallets = [app.wallet_id() for _ in range(100)]
    with WaltzClient(callbacks, app.config) as opener:
        opened = [opener.submit(Open(callbacks, w, 10)) for w in wallets]
        assert all(f.result(TIMEOUT).committed for f in opened)
        opener.ready(TIMEOUT)
    loop_thread = threading.get_ident()  # asyncio.run runs the loop on this thread
    on_loop: list[str] = []

    def statement(conn: Any, cursor: Any, sql: str, *args: Any) -> None:
        if threading.get_ident() == loop_thread:
            on_loop.append(sql[:80])

    async def main() -> tuple[list[Outcome], LoopProbeReport]:
        async with AsyncWaltzClient(callbacks, app.config) as client:
            await client.ready(TIMEOUT)
            event.listen(app.engine, "before_cursor_execute", statement)
            try:
                with loop_probe(0.005) as report:
                    outcomes = await asyncio.gather(
                        *(client.submit_async(Spend(callbacks, w, 1, slow_read=0.01)) for w in wallets)
                    )
                return outcomes, report
            finally:
                event.remove(app.engine, "before_cursor_execute", statement)

    outcomes, report = asyncio.run(main())
    assert all(o.committed for o in outcomes), [o for o in outcomes if not o.committed][:3]
    assert on_loop == [], f"{len(on_loop)} statement(s) ran on the event loop's thread: {on_loop[:3]}"
    assert report.callbacks > len(wallets), report.summary()  # the probe saw the requests' callbacks
    logging.getLogger(__name__).info("%s", report.summary())
