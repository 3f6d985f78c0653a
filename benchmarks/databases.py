"""The databases the benchmarks run against: a fresh one per run, and a database a proxy away.

``fresh_database`` creates a database for a run on the server of a URL (PostgreSQL or
MySQL/MariaDB), or a new SQLite file, and removes it afterwards; ``delayed`` puts a forwarding
proxy (the chaos tools' ``FaultProxy``) between the benchmark and the server, adding a delay each
way: a database server on another host, where every round trip costs more (the round trips
docs/decisions/0050-mark-moved-with-the-first-statement.md and
docs/decisions/0053-snapshot-begin-with-the-mark.md took away).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

#: The proxy process of ``--db-delay``: forwards a free loopback port to host:port, holding every
#: chunk ``delay`` seconds; prints the port, then runs until killed.
_PROXY = """
import sys, threading
from waltz.chaos.proxy import FaultProxy
host, port, delay = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
proxy = FaultProxy(lambda: (host, port), name="database").__enter__()
proxy.set_delay(delay)
print(proxy.port, flush=True)
threading.Event().wait()
"""


@contextmanager
def delayed(url_text: str, delay_ms: float) -> Iterator[str]:
    """``url_text`` through a proxy process adding ``delay_ms`` each way (itself when 0).

    Args:
        url_text: a database server's URL (not SQLite).
        delay_ms: milliseconds the proxy holds every chunk, in each direction.

    Yields:
        The URL through the proxy (127.0.0.1 and the proxy's port); the proxy is killed afterwards.

    Raises:
        SystemExit: SQLite, or the proxy did not start.
    """
    if delay_ms <= 0:
        yield url_text
        return
    url = make_url(url_text)
    if url.get_backend_name() == "sqlite":
        raise SystemExit("--db-delay needs a database server, not SQLite")
    port = url.port or (5432 if url.get_backend_name() == "postgresql" else 3306)
    proxy = subprocess.Popen(
        [sys.executable, "-c", _PROXY, url.host or "127.0.0.1", str(port), str(delay_ms / 1000)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proxy.stdout is not None
        line = proxy.stdout.readline().strip()
        if not line.isdigit():
            raise SystemExit(f"the --db-delay proxy did not start (it printed {line!r})")
        print(f"database reached through a proxy adding {delay_ms:g} ms each way (port {line})", flush=True)
        yield url.set(host="127.0.0.1", port=int(line)).render_as_string(hide_password=False)
    finally:
        proxy.kill()
        proxy.wait(10)


@contextmanager
def fresh_database(url_text: str) -> Iterator[str]:
    """A fresh database on the server of ``url_text`` (or a fresh SQLite file); removed afterwards.

    Its name is ``waltz_bench_<8 hex>``; the connections left to it are closed before it is dropped.

    Args:
        url_text: a PostgreSQL or MySQL/MariaDB server's URL (its database is where the admin
            connection goes), or ``sqlite://`` (a file in a temporary directory) or
            ``sqlite:///path`` (a file to create).

    Yields:
        The new database's URL.

    Raises:
        SystemExit: an unsupported backend, or a SQLite file that exists already.
    """
    url = make_url(url_text)
    backend = url.get_backend_name()
    if backend == "sqlite":
        if not url.database or url.database == ":memory:":
            with tempfile.TemporaryDirectory(prefix="waltz_bench_") as tmp:
                yield f"sqlite:///{tmp}/bench.db"
            return
        path = Path(url.database)
        if path.exists():
            sys.exit(f"{path} exists; give the path of a SQLite file to create (it is deleted at the end)")
        try:
            yield url.render_as_string(hide_password=False)
        finally:
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
        return
    if backend not in ("postgresql", "mysql", "mariadb"):
        sys.exit(f"unsupported database {backend!r}: use PostgreSQL, MySQL/MariaDB or SQLite")
    name = f"waltz_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(
        url, isolation_level="AUTOCOMMIT", poolclass=NullPool, connect_args={"connect_timeout": 5}
    )
    postgres = backend == "postgresql"
    with admin.connect() as conn:
        if postgres:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        else:
            conn.execute(text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            if postgres:
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = :name AND pid <> pg_backend_pid()"
                    ),
                    {"name": name},
                )
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
            else:
                ids = conn.execute(
                    text("SELECT id FROM information_schema.processlist WHERE db = :name"), {"name": name}
                ).scalars()
                for connection_id in list(ids):
                    try:
                        conn.execute(text(f"KILL CONNECTION {int(connection_id)}"))
                    except Exception as error:  # it ended meanwhile
                        if "Unknown thread id" not in str(error):
                            raise
                conn.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
        admin.dispose()
