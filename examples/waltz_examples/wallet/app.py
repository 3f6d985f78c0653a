"""The wallet's HTTP API: a FastAPI app on ``AsyncWaltzClient`` (docs/asyncio-service.md).

- ``POST /wallets/{wallet_id}/deposits`` and ``POST /wallets/{wallet_id}/withdrawals`` take
  ``{"amount": cents, "request_id": "..."}`` and answer the request's :class:`~waltz.Outcome`:
  committed, 201 with the new transaction; dropped, 409 with the reason; already applied (the
  request ID was applied before), 200 with the earlier transaction.
- ``GET /wallets/{wallet_id}`` answers the balance; ``?after=<transaction ID>`` waits until that
  transaction is applied first, so that a caller reads its own write.
- Every request has an answer within ``WALLET_REQUEST_TIMEOUT`` seconds: a movement whose outcome
  is not known by then (the cluster cannot be reached) and a read whose ``after`` is not applied
  here by then are answered 503, to be sent again (a movement with the same ``request_id``).

The app's lifespan opens a :class:`Wallets` (the database, the callbacks, the client), awaits
``ready()`` (the instance caught up with the log) before serving, and closes it on shutdown. Run it
with ``.venv/bin/uvicorn --factory waltz_examples.wallet.app:create_app``; :class:`WalletSettings` come from
``WALLET_*`` variables, the client's from ``WALTZ_*`` (docs/configuration.md). A database the
service cannot use stops ``create_app`` with one ``error:`` line, before uvicorn starts the app.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, TypeVar

from fastapi import FastAPI, HTTPException, Path, Query, Request, Response, status
from pydantic import BaseModel, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy import Engine

from waltz import AsyncWaltzClient, Outcome, WaltzClientConfig
from waltz.cli.database_urls import require_reachable
from waltz.errors import ConfigurationError, TransactionExpiredError
from waltz.jdbc_style import ChangeSetCallbacks, EntityRegistry, create_framework_engine, migrations_api
from waltz_examples.wallet.models import Base, Deposit, Wallet, Withdraw

_Settings = TypeVar("_Settings", bound=BaseSettings)

__all__ = [
    "REQUEST_ID_PATTERN",
    "Balance",
    "Movement",
    "Receipt",
    "WalletSettings",
    "Wallets",
    "create_app",
    "prepare_database",
    "unavailable",
]

#: Wallet IDs are 63-bit: PostgreSQL's BIGINT.
WalletId = Annotated[int, Path(ge=0, lt=1 << 63)]
#: ``?after=``: a transaction ID, a 64-bit mark (-1: none), as the client takes (docs/protocol.md
#: "Append"); a larger one would be waited for until the request timeout.
AfterMark = Annotated[int | None, Query(ge=-1, lt=1 << 63, description="a transaction ID to read after")]
#: Request IDs without control characters (C0, DEL, C1): PostgreSQL's text refuses NUL, so a key
#: holding one, appended, could never be applied (docs/design/sql.md "Skipping a transaction").
REQUEST_ID_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]+$"


class WalletSettings(BaseSettings):
    """The service's settings, from ``WALLET_DATABASE_URL``, ``WALLET_CLUSTER_NAME``,
    ``WALLET_READY_TIMEOUT``.

    Attributes:
        database_url: the instance's database, a synchronous SQLAlchemy URL (``sqlite:///...`` or
            ``postgresql+psycopg://...``; asyncio URLs are refused, docs/sql.md "On asyncio").
        cluster_name: the name this service's marks are kept under in the database.
        ready_timeout: seconds the startup waits for the instance to catch up with the log:
            zero or more, finite (``WALLET_READY_TIMEOUT``).
        request_timeout: seconds a request waits for its outcome, or for ``after`` to be applied
            here, before it is answered 503: above zero, finite (``WALLET_REQUEST_TIMEOUT``).

    Raises:
        ValidationError: a setting does not parse or is out of its range (``create_app`` says it
            in one ``error:`` line per setting).
    """

    model_config = SettingsConfigDict(env_prefix="WALLET_")

    database_url: str = "sqlite:///wallet.db"
    cluster_name: str = "wallet"
    # Finite seconds: the client refuses NaN and infinity (and a context timeout of 0), so a
    # value it would refuse is one `error:` line here, not the lifespan's traceback.
    ready_timeout: float = Field(default=120.0, ge=0, allow_inf_nan=False)
    request_timeout: float = Field(default=10.0, gt=0, allow_inf_nan=False)


class Movement(BaseModel):
    """A deposit's or a withdrawal's body."""

    amount: int = Field(gt=0, lt=1 << 62, description="cents")
    # The idempotency key it becomes is 1 to 190 characters (docs/sql.md, "Idempotency keys"):
    # a longer one is refused here (422), not by the framework once the request is submitted.
    # Control characters are refused too (422): NUL would make the change fail to apply on
    # PostgreSQL for ever, holding back its partition.
    request_id: str = Field(
        min_length=1,
        max_length=190,
        pattern=REQUEST_ID_PATTERN,
        description="the caller's ID of the request, without control characters",
    )


class Receipt(BaseModel):
    """The answer to an applied movement: the transaction that carries it."""

    partition_id: int
    transaction_id: int
    already_applied: bool = False


class Balance(BaseModel):
    """A wallet's balance, as of its partition's ``high_water_mark`` in this instance's database."""

    wallet_id: int
    balance: int
    high_water_mark: int


def prepare_database(url: str) -> None:
    """Create or upgrade the framework's tables and create the wallet's (idempotent), under the
    database's migration lock: workers that start together on a new database take turns."""
    with migrations_api.migration_lock(url) as connection:
        migrations_api.upgrade(connection)
        Base.metadata.create_all(connection)


@dataclass
class Wallets:
    """One instance of the service: its database engine, callbacks and started client."""

    engine: Engine
    callbacks: ChangeSetCallbacks
    client: AsyncWaltzClient
    request_timeout: float = 10.0

    @classmethod
    @asynccontextmanager
    async def open(cls, settings: WalletSettings, config: WaltzClientConfig) -> AsyncIterator[Wallets]:
        """Prepare the database, start the client, and return once the instance caught up with
        the log (``ready``); close everything on exit.

        Raises:
            WaltzTimeoutError: not caught up within ``settings.ready_timeout`` seconds.
        """
        prepare_database(settings.database_url)
        engine = create_framework_engine(settings.database_url)
        try:
            callbacks = ChangeSetCallbacks(
                engine, cluster_name=settings.cluster_name, registry=EntityRegistry.from_base(Base)
            )
            async with AsyncWaltzClient(callbacks, config) as client:
                await client.ready(settings.ready_timeout)
                yield cls(engine, callbacks, client, settings.request_timeout)
        finally:
            engine.dispose()

    async def _submit(self, context: Deposit | Withdraw) -> Outcome:
        """Submit a movement; its outcome within ``request_timeout`` seconds.

        Raises:
            TransactionExpiredError: the context's timeout passed before its append could be sent
                (nothing was appended).
            TimeoutError: no outcome in time: the append may still commit (the submission goes
                on); a retry with the same request ID is answered as already applied if it did.
        """
        return await asyncio.wait_for(self.client.submit_async(context), self.request_timeout)

    async def deposit(self, wallet_id: int, movement: Movement) -> Outcome:
        """Submit a deposit; its outcome (raises as :meth:`_submit`)."""
        return await self._submit(
            Deposit(
                self.callbacks, wallet_id, movement.amount, movement.request_id, timeout=self.request_timeout
            )
        )

    async def withdraw(self, wallet_id: int, movement: Movement) -> Outcome:
        """Submit a withdrawal; its outcome (raises as :meth:`_submit`)."""
        return await self._submit(
            Withdraw(
                self.callbacks, wallet_id, movement.amount, movement.request_id, timeout=self.request_timeout
            )
        )

    async def balance(self, wallet_id: int, after: int | None = None) -> Balance | None:
        """The wallet's balance (None: no such wallet), once transaction ``after`` of its partition
        is applied here when given.

        Raises:
            TimeoutError: ``after`` was not applied here within ``request_timeout`` seconds.
        """
        read = await self.callbacks.read_entities_async(
            [(Wallet, wallet_id)],
            num_partitions=self.client,  # read where the wallet's transactions go, during a split too
            after=after,
            timeout=self.request_timeout,
        )
        wallet = read.entities[0]
        if wallet is None:
            return None
        return Balance(wallet_id=wallet_id, balance=wallet.balance, high_water_mark=read.high_water_mark)


def answer(outcome: Outcome, response: Response) -> Receipt:
    """The HTTP answer of an outcome: 201 committed, 200 already applied, 409 dropped (raised)."""
    if outcome.dropped or outcome.transaction_id is None:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=outcome.reason or "dropped")
    response.status_code = status.HTTP_200_OK if outcome.already_applied else status.HTTP_201_CREATED
    return Receipt(
        partition_id=outcome.partition_id,
        transaction_id=outcome.transaction_id,
        already_applied=outcome.already_applied,
    )


def unavailable(error: Exception) -> HTTPException:
    """The 503 of a request without an outcome in time, saying what to do."""
    if isinstance(error, TransactionExpiredError):
        detail = "the log could not be reached in time and nothing was appended: send the request again"
    else:
        detail = f"no answer in time ({error}): send the request again, with the same request_id"
    return HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, detail=detail, headers={"Retry-After": "1"})


def _settings(kind: type[_Settings]) -> _Settings:
    """``kind()`` from its variables, or exit 1 with one ``error:`` line per setting that is
    missing or invalid (its variable and what to give), in place of pydantic's report."""
    prefix = str(kind.model_config.get("env_prefix", ""))
    try:
        return kind()
    except ValidationError as exc:
        lines = [
            f"error: {prefix}{str(error['loc'][0]).upper() if error['loc'] else ''}: {error['msg']}"
            for error in exc.errors(include_url=False, include_input=False)
        ]
        raise SystemExit("\n".join(lines)) from exc


def create_app(settings: WalletSettings | None = None, config: WaltzClientConfig | None = None) -> FastAPI:
    """The wallet's app, once its database answers (uvicorn's ``--factory``).

    Args:
        settings: the service's settings; default: from the ``WALLET_*`` variables.
        config: the Waltz client's configuration; default: from the ``WALTZ_*`` variables.

    Raises:
        SystemExit: exit status 1, before uvicorn starts the app: a ``WALLET_*`` or ``WALTZ_*``
            setting is missing or invalid (one ``error:`` line each, naming its variable), a file
            the client reads cannot be used (its TLS files, its ZooKeeper credential file:
            ``WaltzClientConfig.check_files``, one ``error:`` line naming the variable and the
            file), or the database of ``settings.database_url`` cannot be used (a URL that does
            not parse, a driver that is not installed or is an asyncio one, a server that does not
            answer, a database that does not exist: one ``error:`` line naming
            ``WALLET_DATABASE_URL``, the URL without its password and what is wrong). uvicorn
            prints any other exception, here or in the lifespan, with its traceback.
    """
    wallet_settings = settings or _settings(WalletSettings)
    try:
        require_reachable(wallet_settings.database_url, "WALLET_DATABASE_URL")
    except ConfigurationError as exc:
        raise SystemExit(f"error: {exc}") from exc
    # WaltzClientConfig() reads its required fields from the WALTZ_* variables: read here, before
    # uvicorn starts the app, so that a variable not set is one line, not the lifespan's traceback.
    client_config = config or _settings(WaltzClientConfig)
    try:  # the files the client reads (a stopped `waltz up`'s exports name files gone with it)
        client_config.check_files()
    except ConfigurationError as exc:
        raise SystemExit(f"error: {exc}") from exc

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with Wallets.open(wallet_settings, client_config) as wallets:
            app.state.wallets = wallets
            yield

    app = FastAPI(title="wallet", lifespan=lifespan)

    def wallets(request: Request) -> Wallets:
        found: Wallets = request.app.state.wallets
        return found

    @app.post("/wallets/{wallet_id}/deposits", status_code=201)
    async def deposit(
        wallet_id: WalletId, movement: Movement, request: Request, response: Response
    ) -> Receipt:
        try:
            outcome = await wallets(request).deposit(wallet_id, movement)
        except (TimeoutError, TransactionExpiredError) as error:
            raise unavailable(error) from error
        return answer(outcome, response)

    @app.post("/wallets/{wallet_id}/withdrawals", status_code=201)
    async def withdraw(
        wallet_id: WalletId, movement: Movement, request: Request, response: Response
    ) -> Receipt:
        try:
            outcome = await wallets(request).withdraw(wallet_id, movement)
        except (TimeoutError, TransactionExpiredError) as error:
            raise unavailable(error) from error
        return answer(outcome, response)

    @app.get("/wallets/{wallet_id}")
    async def balance(wallet_id: WalletId, request: Request, after: AfterMark = None) -> Balance:
        try:
            found = await wallets(request).balance(wallet_id, after)
        except TimeoutError as error:
            raise unavailable(error) from error
        if found is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no wallet {wallet_id}")
        return found

    return app
