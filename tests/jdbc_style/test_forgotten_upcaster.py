"""A model that gained an attribute without its ``AddAttribute`` upcaster, on PostgreSQL
(docs/design/sql.md "Schema versions and upcasting"; docs/sql.md "Changing a model").

Version 1 of a member has ``points``; version 2 renames it ``score`` (its upcaster declared) and
adds ``tier``: the migration gives the members already there ``legacy``, the model gives new ones
``basic``, and the team forgot ``AddAttribute(1, "tier", "legacy")``. A new instance applying the
log from its start must not give the old members ``basic`` where the migrated database says
``legacy`` (a rebuild refuses those changes): it refuses them, naming what is missing and the
upcaster to declare, and applies nothing and skips nothing. With the upcaster declared it catches
up to the migrated database's rows.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import support
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import Column, Engine, Integer, String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from waltz import WaltzClient, WaltzClientConfig
from waltz.jdbc_style import (
    AddAttribute,
    ChangeSetCallbacks,
    EntityRegistry,
    EntityTransaction,
    EntityTransactionContext,
    RenameAttribute,
    UpcastError,
    WaltzEntity,
    create_framework_engine,
)
from waltz.jdbc_style.migrations_api import upgrade
from waltz.local.cluster import LocalCluster
from waltz.local.processes import wait_until

TIMEOUT = 60
NAME = "forgotten"


class V1(DeclarativeBase):
    pass


class MemberV1(V1):
    __tablename__ = "forgotten_members"
    __waltz__ = WaltzEntity("forgotten_member")
    member_id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    points: Mapped[int] = mapped_column(Integer)


class Forgot(DeclarativeBase):
    pass


class MemberForgot(Forgot):
    """Version 2 without the upcaster of ``tier``."""

    __tablename__ = "forgotten_members"
    __waltz__ = WaltzEntity(
        "forgotten_member", schema_version=2, upcasters=[RenameAttribute(1, "points", "score")]
    )
    member_id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    score: Mapped[int] = mapped_column(Integer)
    tier: Mapped[str] = mapped_column(String(10), default="basic", server_default="basic")


class Fixed(DeclarativeBase):
    pass


class MemberFixed(Fixed):
    """Version 2 as it should have been."""

    __tablename__ = "forgotten_members"
    __waltz__ = WaltzEntity(
        "forgotten_member",
        schema_version=2,
        upcasters=[RenameAttribute(1, "points", "score"), AddAttribute(1, "tier", "legacy")],
    )
    member_id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    score: Mapped[int] = mapped_column(Integer)
    tier: Mapped[str] = mapped_column(String(10), default="basic", server_default="basic")


class Earn(EntityTransactionContext):
    """Version 1's only request: a member earns points (joining with the first)."""

    def __init__(self, callbacks: ChangeSetCallbacks, member_id: int, points: int) -> None:
        super().__init__(callbacks, (MemberV1, member_id))
        self.member_id, self.points = member_id, points

    def run(self, tx: EntityTransaction) -> bool:
        member = tx.get(MemberV1, self.member_id)
        if member is None:
            tx.insert(MemberV1, member_id=self.member_id, points=self.points)
        else:
            tx.update(member, points=member.points + self.points)
        return True


@pytest.fixture(scope="module")
def forgotten_cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: object) -> Iterator[LocalCluster]:
    with support.session_cluster(tmp_path_factory, zookeeper, name=NAME, partitions=1) as cluster:
        cluster.wait_ready(TIMEOUT)
        yield cluster


def migrate(engine: Engine) -> None:
    """The alembic migration of version 2: ``points`` renamed, ``tier`` added as ``legacy``."""
    with engine.begin() as conn:
        op = Operations(MigrationContext.configure(conn))
        op.alter_column("forgotten_members", "points", new_column_name="score")
        op.add_column(
            "forgotten_members", Column("tier", String(10), nullable=False, server_default="legacy")
        )
        op.alter_column("forgotten_members", "tier", server_default="basic")


def members(engine: Engine) -> dict[int, tuple[int, str]]:
    table = MemberFixed.__table__
    with engine.connect() as conn:
        return {r.member_id: (r.score, r.tier) for r in conn.execute(select(table))}


def client_of(cluster: LocalCluster, callbacks: ChangeSetCallbacks) -> WaltzClient:
    client = WaltzClient(callbacks, WaltzClientConfig(**cluster.client_settings()))
    client.wait_mounted(TIMEOUT)
    return client


def test_an_attribute_added_without_its_upcaster_is_refused_by_a_new_instance_not_defaulted(
    forgotten_cluster: LocalCluster, postgres_url: str, postgres_server: support.DatabaseServer
) -> None:
    migrated = create_framework_engine(postgres_url)
    try:
        upgrade(migrated)
        V1.metadata.create_all(migrated)
        writer = ChangeSetCallbacks(migrated, cluster_name=NAME, registry=EntityRegistry([MemberV1]))
        with client_of(forgotten_cluster, writer) as client:
            for member_id, points in ((1, 10), (2, 20), (1, 5)):
                assert client.submit(Earn(writer, member_id, points)).result(TIMEOUT).committed
            client.flush(TIMEOUT)
            log_end = client.get_high_water_mark(0)
            assert writer.wait_for(0, log_end, TIMEOUT)
        migrate(migrated)
        assert members(migrated) == {1: (15, "legacy"), 2: (20, "legacy")}

        with postgres_server.fresh_database() as fresh_url:
            fresh = create_framework_engine(fresh_url)
            try:
                upgrade(fresh)
                Forgot.metadata.create_all(fresh)
                forgot = ChangeSetCallbacks(fresh, cluster_name=NAME, registry=EntityRegistry([MemberForgot]))
                with client_of(forgotten_cluster, forgot) as client:
                    reason = wait_until(
                        lambda: client.unhealthy_partitions().get(0),
                        timeout=TIMEOUT,
                        what="the instance without the upcaster to refuse the first change of version 1",
                    )
                    error = reason if isinstance(reason, UpcastError) else reason.__cause__
                    assert isinstance(error, UpcastError), repr(reason)
                    said = str(error)
                    assert "insert of forgotten_member {'member_id': 1}" in said, said
                    assert "written at schema version 1 and upcast to 2, lacks ['tier']" in said, said
                    assert "Declare AddAttribute(1, 'tier', value)" in said, said
                    assert forgot.high_water_marks() == {0: -1}, "a change was applied or skipped"
                assert members(fresh) == {}, "the old members were given the model's default"

                # The upcaster declared: the same database catches up to the migrated one's rows.
                fixed = ChangeSetCallbacks(fresh, cluster_name=NAME, registry=EntityRegistry([MemberFixed]))
                with client_of(forgotten_cluster, fixed) as client:
                    assert fixed.wait_for(0, log_end, TIMEOUT)
                    assert not client.unhealthy_partitions()
                assert members(fresh) == members(migrated)
            finally:
                fresh.dispose()
    finally:
        migrated.dispose()
