"""``waltz rebuild`` names its log source as every command that reaches a cluster does, and a
source it cannot use is refused before Spark starts."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from waltz.cli.main import app
from waltz.cli.rebuild import log_source
from waltz.errors import ConfigurationError

#: Wide: rich wraps errors at the terminal width. Each test empties the cluster variables first.
_ENV = {"COLUMNS": "300"}
_CLUSTER_VARIABLES = (
    "WALTZ_ZOOKEEPER_CONNECT_STRING",
    "WALTZ_CLUSTER_ROOT",
    "WALTZ_ZOOKEEPER_AUTH_DIGEST",
    "WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE",
    "WALTZ_CLUSTER_SSL_CA_FILE",
    "WALTZ_CLUSTER_SSL_CERT_FILE",
    "WALTZ_CLUSTER_SSL_KEY_FILE",
)


@pytest.fixture(autouse=True)
def _no_cluster_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _CLUSTER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def _rebuild(*arguments: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(
        app, ["rebuild", "--app", "waltz_examples.ledger", "--check", *arguments], env={**_ENV, **(env or {})}
    )
    return result.exit_code, result.output


def test_the_cluster_comes_from_the_environment_or_a_configuration_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    digest = tmp_path / "client.digest"
    digest.write_text("client:secret\n")
    monkeypatch.setenv("WALTZ_ZOOKEEPER_CONNECT_STRING", "127.0.0.1:2181")
    monkeypatch.setenv("WALTZ_CLUSTER_ROOT", "/waltz/c1")
    monkeypatch.setenv("WALTZ_ZOOKEEPER_AUTH_DIGEST_FILE", str(digest))
    source = log_source()
    assert (source.zookeeper, source.cluster_root) == ("127.0.0.1:2181", "/waltz/c1")
    assert source.zookeeper_files == {"zookeeper_auth_digest_file": digest}
    assert not source.storage_dirs
    # The options win over the variables; a file names what neither gives.
    assert log_source(zookeeper="127.0.0.2:2181", root="/waltz/c2").cluster_root == "/waltz/c2"
    monkeypatch.delenv("WALTZ_CLUSTER_ROOT")
    config = tmp_path / "admin.yaml"
    config.write_text("cluster:\n  root: /waltz/c3\n")
    assert log_source(config=config).cluster_root == "/waltz/c3"
    # Replica directories are read offline, whatever the variables say.
    offline = log_source(storage_dirs=[tmp_path / "s0"], replicas=1)
    assert (offline.zookeeper, list(offline.storage_dirs)) == (None, [str(tmp_path / "s0")])
    assert "archive" not in offline.options()
    # --archive reaches the data source, offline and live alike.
    archived = log_source(storage_dirs=[tmp_path / "s0"], replicas=1, archive="s3://bucket/archive")
    assert archived.options()["archive"] == "s3://bucket/archive"
    assert log_source(root="/waltz/c2", archive="off").options()["archive"] == "off"


def test_a_missing_source_is_named_before_spark_starts() -> None:
    code, output = _rebuild()
    assert code == 2, output
    assert "--zookeeper, WALTZ_ZOOKEEPER_CONNECT_STRING" in output, output
    assert "--root, WALTZ_CLUSTER_ROOT" in output, output
    assert "--storage-dir" in output, output
    assert "starting Spark" not in output, output


def test_both_sources_or_an_inline_credential_are_refused(tmp_path: Path) -> None:
    code, output = _rebuild("--zookeeper", "127.0.0.1:2181", "--storage-dir", str(tmp_path))
    assert code == 2, output
    assert "not both" in output, output
    code, output = _rebuild(
        "-z", "127.0.0.1:2181", "-r", "/waltz/c1", env={"WALTZ_ZOOKEEPER_AUTH_DIGEST": "client:secret"}
    )
    assert code == 2, output
    assert "zookeeper.auth.digestFile" in output, output
    assert "client:secret" not in output, output
    assert "starting Spark" not in output, output


def test_the_old_spelling_of_the_root_still_works() -> None:
    with pytest.raises(ConfigurationError, match="not both"):
        log_source(root="/waltz/c1", storage_dirs=[Path("/nonexistent")])
    code, output = _rebuild(
        "--zookeeper",
        "127.0.0.1:2181",
        "--cluster-root",
        "/waltz/c1",
        env={"WALTZ_ZOOKEEPER_AUTH_DIGEST": "x:y"},
    )
    assert code == 2 and "zookeeper.auth.digestFile" in output, output


def test_a_database_that_cannot_work_is_refused_before_spark_starts(
    tmp_path: Path, postgres_url: str
) -> None:
    """An absent database, or a URL SQLAlchemy does not take, fails at once, saying what to do."""
    from sqlalchemy.engine import make_url

    absent = make_url(postgres_url).set(database="waltz_test_absent_database").render_as_string(False)
    where = ("--storage-dir", str(tmp_path), "--replicas", "1")
    code, output = _rebuild("--db", absent, *where)
    assert code == 2, output
    assert "--db " in output and "does not exist (create it first, e.g. createdb)" in output
    assert "starting Spark" not in output
    code, output = _rebuild("--verify-against", "postgres://postgres@127.0.0.1/ledger", *where)
    assert code == 2, output
    assert "postgresql+psycopg://" in output and "starting Spark" not in output


def test_a_snapshot_and_a_drift_check_are_refused_together(tmp_path: Path) -> None:
    """The drift check reads the whole log: a snapshot given beside it would be passed over."""
    code, output = _rebuild(
        "--from-snapshot",
        str(tmp_path / "snapshot"),
        "--verify-against",
        "sqlite:///live.db",
        "--storage-dir",
        str(tmp_path),
        "--replicas",
        "1",
    )
    assert code == 2, output
    assert "--from-snapshot and --verify-against do not go together" in output
    assert "starting Spark" not in output


def test_a_wrong_root_or_a_directory_without_a_log_is_refused_before_spark_starts(
    tmp_path: Path, zookeeper: Any, zk_root: str
) -> None:
    """The log is planned before Spark starts, which takes seconds: a typo in the root, or a
    directory that holds no replica, fails at once (docs/design/spark.md, "Planning before Spark
    starts")."""
    code, output = _rebuild("--zookeeper", zookeeper.connect_string, "--root", zk_root)
    assert code == 2, output
    assert f"no cluster under {zk_root}" in output, output
    assert "planning the log" in output, output
    assert "starting Spark" not in output, output
    (tmp_path / "empty").mkdir()
    code, output = _rebuild("--storage-dir", str(tmp_path / "empty"), "--replicas", "1")
    assert code == 2, output
    assert "waltz-storage.ctl" in output, output
    assert "starting Spark" not in output, output


#: The views of an application whose entity has a ``Time`` column, which the rebuild cannot write.
_TIME_APP = """
import datetime as dt

from sqlalchemy import BigInteger, Time
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from waltz.jdbc_style import EntityRegistry, WaltzEntity, migrations_api
from waltz.spark.views import AppViews, apply_idempotency, entity_table, replay


class Base(DeclarativeBase):
    pass


class Shop(Base):
    __tablename__ = "shops"
    __waltz__ = WaltzEntity("test.shop")
    shop_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    opens: Mapped[dt.time | None] = mapped_column(Time)


ENTITIES = EntityRegistry([Shop])


def build(changes, log):
    return {"shops": entity_table(replay(apply_idempotency(changes)), ENTITIES, Shop)}


def prepare(engine):
    migrations_api.upgrade(engine)
    Base.metadata.create_all(engine)


VIEWS = AppViews("shops", tables=[Shop.__table__], prepare=prepare, build=build, entities=ENTITIES)
"""


def test_a_column_type_the_rebuild_cannot_write_is_refused_before_spark_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``Time`` column failed the rebuild with a traceback (exit 1) once the whole log was read."""
    package = tmp_path / "waltz_test_time_app"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "views.py").write_text(_TIME_APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "s0").mkdir()
    result = CliRunner().invoke(
        app,
        [
            "rebuild",
            "--app",
            "waltz_test_time_app",
            "--storage-dir",
            str(tmp_path / "s0"),
            "--replicas",
            "1",
            "--db",
            f"sqlite:///{tmp_path / 'shops.db'}",
        ],
        env=_ENV,
    )
    output = result.output
    assert result.exit_code == 2, output
    assert "error: " in output and "shops.opens" in output and "TIME" in output, output
    assert "planning the log" not in output and "starting Spark" not in output, output


def test_a_snapshot_that_is_not_there_is_refused_before_spark_starts(tmp_path: Path) -> None:
    """--from-snapshot naming no snapshot was refused only once Spark had started."""
    code, output = _rebuild_into(
        tmp_path, "--from-snapshot", str(tmp_path / "nonexistent"), "--storage-dir", str(tmp_path)
    )
    assert code == 2, output
    assert f"error: {tmp_path / 'nonexistent'}" in output, output
    assert "planning the log" not in output and "starting Spark" not in output, output


def _rebuild_into(tmp_path: Path, *arguments: str) -> tuple[int, str]:
    """A rebuild of the ledger into a SQLite database in ``tmp_path``."""
    result = CliRunner().invoke(
        app,
        [
            "rebuild",
            "--app",
            "waltz_examples.ledger",
            "--db",
            f"sqlite:///{tmp_path / 'ledger.db'}",
            "--replicas",
            "1",
            *arguments,
        ],
        env=_ENV,
    )
    return result.exit_code, result.output


def test_a_live_database_that_is_not_one_is_refused_before_spark_starts(tmp_path: Path) -> None:
    """--verify-against a SQLite file that did not exist created it empty, and a database without
    the framework's tables failed with a raw SQL error once Spark had read the log."""
    missing = tmp_path / "missing.db"
    where = ("--storage-dir", str(tmp_path), "--replicas", "1")
    code, output = _rebuild("--verify-against", f"sqlite:///{missing}", *where)
    assert code == 2, output
    assert f"no such SQLite file {missing}" in output and "starting Spark" not in output, output
    assert not missing.exists()

    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    code, output = _rebuild("--verify-against", f"sqlite:///{empty}", *where)
    assert code == 2, output
    assert "--verify-against" in output and "waltz db upgrade" in output, output
    assert "no such table" not in output and "starting Spark" not in output, output
