"""The wallet's HTTP API against a real local cluster and database, through httpx's ASGI transport;
uvicorn's start on a database the service cannot use."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import make_url

from waltz import WaltzClientConfig
from waltz.local.cluster import LocalCluster
from waltz.local.processes import free_port
from waltz_examples.wallet.app import WalletSettings, create_app


@asynccontextmanager
async def serving(
    db_url: str, config: WaltzClientConfig, request_timeout: float = 10.0
) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client of a wallet instance on ``db_url``, served once the instance is ready (the
    app's lifespan, as a server runs it) and shut down on exit."""
    app = create_app(WalletSettings(database_url=db_url, request_timeout=request_timeout), config)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://wallet") as http,
    ):
        yield http


def new_wallet() -> int:
    """A wallet ID no other test uses (the tests share the cluster's log)."""
    return random.randrange(1, 1 << 62)


async def move(
    http: httpx.AsyncClient, wallet: int, kind: str, amount: int, request_id: str
) -> httpx.Response:
    return await http.post(f"/wallets/{wallet}/{kind}", json={"amount": amount, "request_id": request_id})


def test_concurrent_withdrawals_never_overdraw(wallet_db: str, wallet_config: WaltzClientConfig) -> None:
    wallet = new_wallet()

    async def main() -> None:
        async with serving(wallet_db, wallet_config) as http:
            opened = await move(http, wallet, "deposits", 100, f"open-{wallet}")
            assert opened.status_code == 201, opened.text
            answers = await asyncio.gather(
                *(move(http, wallet, "withdrawals", 10, f"take-{wallet}-{n}") for n in range(25))
            )
            codes = Counter(a.status_code for a in answers)
            assert codes == {201: 10, 409: 15}, [a.text for a in answers if a.status_code not in (201, 409)]
            refused = [a.json()["detail"] for a in answers if a.status_code == 409]
            assert all(r.startswith(f"insufficient funds: wallet {wallet} holds") for r in refused), refused
            last = max(a.json()["transaction_id"] for a in answers if a.status_code == 201)
            read = await http.get(f"/wallets/{wallet}", params={"after": last})
            assert read.status_code == 200 and read.json()["balance"] == 0, read.text

    asyncio.run(main())


def test_a_retried_request_is_applied_once(wallet_db: str, wallet_config: WaltzClientConfig) -> None:
    wallet = new_wallet()

    async def main() -> None:
        async with serving(wallet_db, wallet_config) as http:
            first = await move(http, wallet, "deposits", 50, f"dep-{wallet}")
            assert first.status_code == 201, first.text
            receipt = first.json()
            await http.get(f"/wallets/{wallet}", params={"after": receipt["transaction_id"]})
            retried = await move(http, wallet, "deposits", 50, f"dep-{wallet}")
            assert retried.status_code == 200, retried.text
            assert retried.json() == {**receipt, "already_applied": True}

            # A withdrawal that emptied the wallet, retried: the earlier transaction, not a 409.
            taken = await move(http, wallet, "withdrawals", 50, f"wd-{wallet}")
            assert taken.status_code == 201, taken.text
            await http.get(f"/wallets/{wallet}", params={"after": taken.json()["transaction_id"]})
            again = await move(http, wallet, "withdrawals", 50, f"wd-{wallet}")
            assert again.status_code == 200 and again.json() == {**taken.json(), "already_applied": True}

            # Copies of one request sent at once: whatever each is answered, one is applied.
            copies = await asyncio.gather(
                *(move(http, wallet, "deposits", 7, f"dup-{wallet}") for _ in range(8))
            )
            assert {c.status_code for c in copies} <= {200, 201}, [c.text for c in copies]
            last = max(c.json()["transaction_id"] for c in copies)
            read = await http.get(f"/wallets/{wallet}", params={"after": last})
            assert read.json()["balance"] == 7, read.text

            missing = await http.get(f"/wallets/{new_wallet()}")
            assert missing.status_code == 404
            nothing = await move(http, new_wallet(), "withdrawals", 1, f"none-{wallet}")
            assert nothing.status_code == 409 and nothing.json()["detail"].startswith("no wallet")
            invalid = await move(http, wallet, "deposits", 0, f"zero-{wallet}")
            assert invalid.status_code == 422
            # An idempotency key is at most 190 characters: a longer request ID is the caller's error.
            too_long = await move(http, wallet, "deposits", 1, "r" * 191)
            assert too_long.status_code == 422, too_long.text
            longest = await move(http, wallet, "deposits", 1, f"{wallet}-".ljust(190, "r"))
            assert longest.status_code == 201, longest.text

    asyncio.run(main())


def test_a_deposit_that_would_overflow_the_balance_is_dropped(
    wallet_db: str, wallet_config: WaltzClientConfig
) -> None:
    """A deposit whose new balance would exceed the largest ``BIGINT`` is dropped (409, with the
    reason), not appended: appended, it could never be applied, and every later transaction of its
    partition would wait behind it. A deposit up to that largest balance is applied."""
    wallet = new_wallet()
    most = (1 << 63) - 1
    big = (1 << 62) - 1  # the largest amount a request takes

    async def main() -> None:
        async with serving(wallet_db, wallet_config) as http:
            for n in range(2):
                paid = await move(http, wallet, "deposits", big, f"big-{wallet}-{n}")
                assert paid.status_code == 201, paid.text
            over = await move(http, wallet, "deposits", big, f"big-{wallet}-2")
            assert over.status_code == 409, over.text
            assert over.json()["detail"] == (
                f"balance overflow: wallet {wallet} holds {2 * big} cents; a deposit of {big} would "
                f"take it above {most}"
            ), over.text
            topped = await move(http, wallet, "deposits", most - 2 * big, f"top-{wallet}")
            assert topped.status_code == 201, topped.text
            read = await http.get(f"/wallets/{wallet}", params={"after": topped.json()["transaction_id"]})
            assert read.status_code == 200 and read.json()["balance"] == most, read.text

    asyncio.run(main())


def test_request_ids_with_control_characters_and_marks_beyond_64_bits_are_refused_with_422(
    wallet_db: str, wallet_config: WaltzClientConfig
) -> None:
    """A request ID with a NUL or another control character (which PostgreSQL's text refuses) and
    an ``after`` that is no 64-bit transaction ID are the caller's errors, answered 422 at once,
    where the first was a 500 and the second waited out the request timeout for a 503."""
    wallet = new_wallet()

    async def main() -> None:
        async with serving(wallet_db, wallet_config, request_timeout=30.0) as http:
            for request_id in (f"nul-{wallet}\x00", f"tab-{wallet}\t", f"del-{wallet}\x7f", "\x85"):
                refused = await move(http, wallet, "deposits", 1, request_id)
                assert refused.status_code == 422, (request_id, refused.text)
            paid = await move(http, wallet, "deposits", 3, f"ok-{wallet}-é✓")  # not ASCII, printable
            assert paid.status_code == 201, paid.text
            started = time.monotonic()
            for after in (1 << 63, 99999999999999999999, -2):
                refused = await http.get(f"/wallets/{wallet}", params={"after": after})
                assert refused.status_code == 422, (after, refused.text)
            assert time.monotonic() - started < 10, "a mark beyond 64 bits was waited for"
            read = await http.get(f"/wallets/{wallet}", params={"after": paid.json()["transaction_id"]})
            assert read.status_code == 200 and read.json()["balance"] == 3, read.text

    asyncio.run(main())


def test_a_restarted_instance_catches_up_before_serving(
    wallet_db: str, wallet_config: WaltzClientConfig, tmp_path: Path
) -> None:
    """An instance stopped while another one keeps serving answers, once restarted, with what the
    other committed meanwhile: its startup waited for ``ready()``."""
    wallet = new_wallet()
    other_db = f"sqlite:///{tmp_path / 'other.db'}"

    async def main() -> None:
        async with serving(wallet_db, wallet_config) as http:
            assert (await move(http, wallet, "deposits", 30, f"first-{wallet}")).status_code == 201
        async with serving(other_db, wallet_config) as other:
            answers = [await move(other, wallet, "deposits", 1, f"more-{wallet}-{n}") for n in range(40)]
            assert all(a.status_code == 201 for a in answers), [a.text for a in answers]
        async with serving(wallet_db, wallet_config) as http:
            read = await http.get(f"/wallets/{wallet}")  # no `after`: the instance caught up first
            assert read.status_code == 200 and read.json()["balance"] == 70, read.text

    asyncio.run(main())


def test_requests_are_answered_503_in_time_when_the_log_cannot_be_reached(
    waltz_cluster_factory: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    """A cluster of the test's own loses its only server: a movement is answered 503 within the
    request timeout, nothing appended (its append waited unsent for the mount), and so is a read
    whose ``after`` is not applied here; once the server is back, the same request commits once."""
    cluster = waltz_cluster_factory(name="wallet-unreachable", partitions=1, servers=1)
    config = WaltzClientConfig(**cluster.client_settings())
    wallet = new_wallet()

    async def main() -> None:
        async with serving(f"sqlite:///{tmp_path / 'wallet.db'}", config, request_timeout=2.0) as http:
            opened = await move(http, wallet, "deposits", 100, f"open-{wallet}")
            assert opened.status_code == 201, opened.text
            first = opened.json()["transaction_id"]
            cluster.stop_server(0)
            started = time.monotonic()
            answers = [await move(http, wallet, "deposits", 5, f"more-{wallet}") for _ in range(2)]
            assert [a.status_code for a in answers] == [503, 503], [a.text for a in answers]
            assert time.monotonic() - started < 20, "the request timeout did not bound the answers"
            assert answers[0].headers["retry-after"] == "1" and "send the request again" in answers[0].text
            read = await http.get(f"/wallets/{wallet}", params={"after": first + 1_000})
            assert read.status_code == 503, read.text
            cluster.restart_server(0)
            for _ in range(60):  # bounded: the client mounts the partition again within seconds
                again = await move(http, wallet, "deposits", 5, f"more-{wallet}")
                if again.status_code != 503:
                    break
                await asyncio.sleep(0.5)
            assert again.status_code == 201, again.text
            assert again.json()["transaction_id"] == first + 1, "an expired request was appended after all"
            read = await http.get(f"/wallets/{wallet}", params={"after": first + 1})
            assert read.status_code == 200 and read.json()["balance"] == 105, read.text

    asyncio.run(main())


def _serve(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``uvicorn --factory waltz_examples.wallet.app:create_app`` with ``env``, run to its end (a
    start that fails; 60 s at most)."""
    return subprocess.run(
        [sys.executable, "-m", "uvicorn", "--factory", "waltz_examples.wallet.app:create_app", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
        env=env,
    )


#: The database URLs a first start gets wrong, each with what its ``error:`` line says. In each the
#: password is ``s3cret``; ``{server}`` is the test's PostgreSQL server, as ``host:port``; ``{free}``
#: a port where nothing listens.
_UNUSABLE_DATABASES = {
    "nothing listens": (
        "postgresql+psycopg://postgres:s3cret@127.0.0.1:{free}/wallet",
        "postgresql+psycopg://postgres:***@127.0.0.1:{free}/wallet: cannot connect: ",
    ),
    "no such database": (
        "postgresql+psycopg://postgres:s3cret@{server}/waltz_test_absent_database",
        'database "waltz_test_absent_database" does not exist (create it first, e.g. createdb)',
    ),
    "malformed": (
        "postgresql+psycopg://postgres:s3cret@127.0.0.1:port/wallet",
        "WALLET_DATABASE_URL (unparsable URL): ",
    ),
    "driver not installed": (
        "mysql+mysqldb://root:s3cret@127.0.0.1/wallet",
        "mysql+mysqldb://root:***@127.0.0.1/wallet: No module named 'MySQLdb'",
    ),
    "asyncio driver": (
        "postgresql+psycopg_async://postgres:s3cret@{server}/wallet",
        "an asyncio driver; give the synchronous URL postgresql+psycopg://postgres:***@",
    ),
}


@pytest.mark.parametrize("case", list(_UNUSABLE_DATABASES))
def test_uvicorn_refuses_a_database_it_cannot_use_in_one_line(
    case: str, waltz_postgres_url: str, tmp_path: Path
) -> None:
    """``uvicorn --factory ...:create_app`` with an unusable ``WALLET_DATABASE_URL`` prints one
    ``error:`` line naming the setting, the URL without its password and what is wrong, and exits
    1, instead of uvicorn's and Starlette's tracebacks."""
    server = make_url(waltz_postgres_url)
    places = {"free": free_port(), "server": f"{server.host}:{server.port}"}
    url, expected = (text.format(**places) for text in _UNUSABLE_DATABASES[case])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WALLET_", "WALTZ_"))}
    env |= {
        "WALLET_DATABASE_URL": url,
        # A client configuration that parses: the database is what is wrong.
        "WALTZ_ZOOKEEPER_CONNECT_STRING": f"127.0.0.1:{free_port()}",
        "WALTZ_CLUSTER_ROOT": "/waltz/wallet",
    }
    done = _serve(env, tmp_path)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: WALLET_DATABASE_URL "), done.stderr
    assert expected in lines[0], done.stderr
    assert "s3cret" not in done.stderr


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        # As docs/asyncio-service.md shows each, in its bullet on a setting not given.
        ("WALLET_READY_TIMEOUT", "-1", "Input should be greater than or equal to 0"),
        ("WALLET_READY_TIMEOUT", "nan", "Input should be a finite number"),
        ("WALLET_READY_TIMEOUT", "inf", "Input should be a finite number"),
        ("WALLET_REQUEST_TIMEOUT", "inf", "Input should be a finite number"),
    ],
)
def test_uvicorn_refuses_a_timeout_that_is_not_finite_seconds_in_one_line(
    variable: str, value: str, said: str, tmp_path: Path
) -> None:
    """A timeout setting that is negative, NaN or infinite is one ``error:`` line naming its
    variable, before the app starts, where the lifespan (or every request) failed with a
    traceback on the client's refusal of it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WALLET_", "WALTZ_"))}
    env |= {"WALLET_DATABASE_URL": f"sqlite:///{tmp_path / 'wallet.db'}", variable: value}
    done = _serve(env, tmp_path)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines == [f"error: {variable}: {said}"], done.stderr


#: The files of a stopped ``waltz up`` whose exports a shell still holds, by variable.
_GONE_FILES = {
    "WALTZ_CLIENT_TLS_CA_FILE": "/nonexistent/tls/ca.pem",
    "WALTZ_CLIENT_TLS_CERT_FILE": "/nonexistent/tls/client.pem",
    "WALTZ_CLIENT_TLS_KEY_FILE": "/nonexistent/tls/client-key.pem",
    "WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE": "/nonexistent/zookeeper-credentials/operator.digest",
}


@pytest.mark.parametrize(
    ("given", "named"),
    [
        (list(_GONE_FILES), "WALTZ_CLIENT_TLS_CA_FILE"),
        (["WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE"], "WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE"),
    ],
    ids=["tls-and-digest", "digest"],
)
def test_uvicorn_refuses_client_files_it_cannot_read_in_one_line(
    given: list[str], named: str, tmp_path: Path
) -> None:
    """The client's TLS and ZooKeeper credential files that are not there (a stopped ``waltz
    up``'s exports) are one ``error:`` line naming the variable and the file, exit 1, before the
    app starts, where the lifespan's client failed with a traceback and exit 3."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WALLET_", "WALTZ_"))}
    env |= {
        "WALLET_DATABASE_URL": f"sqlite:///{tmp_path / 'wallet.db'}",
        "WALTZ_ZOOKEEPER_CONNECT_STRING": f"127.0.0.1:{free_port()}",
        "WALTZ_CLUSTER_ROOT": "/waltz/wallet",
    }
    env |= {variable: _GONE_FILES[variable] for variable in given}
    done = _serve(env, tmp_path)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith("error: "), done.stderr
    assert named in lines[0] and _GONE_FILES[named] in lines[0], done.stderr


def test_uvicorn_names_each_setting_missing_or_invalid_in_one_line(tmp_path: Path) -> None:
    """Started without the ``export`` lines of ``waltz up`` (and with a setting of the wallet's
    that does not parse), ``uvicorn --factory ...:create_app`` prints one ``error:`` line per
    setting, naming its variable, and exits 1 before the app starts, instead of the lifespan's
    traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WALLET_", "WALTZ_"))}
    env |= {"WALLET_DATABASE_URL": f"sqlite:///{tmp_path / 'wallet.db'}", "WALLET_REQUEST_TIMEOUT": "ten"}
    done = _serve(env, tmp_path)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith("error: WALLET_REQUEST_TIMEOUT: "), done.stderr
    env["WALLET_REQUEST_TIMEOUT"] = "10"
    done = _serve(env, tmp_path)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2, done.stderr
    assert lines[0].startswith("error: WALTZ_ZOOKEEPER_CONNECT_STRING: not set"), done.stderr
    assert lines[1].startswith("error: WALTZ_CLUSTER_ROOT: not set"), done.stderr
    assert "waltz up" in lines[0], done.stderr
