"""The commands that take an application (``--app``) refuse one whose models do not declare their
schema versions as a chain (a ``schema_version`` raised without an upcaster) with the declaration's
own message and exit 2, never a traceback (docs/design/sql.md "Schema versions and upcasting")."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from waltz.cli.main import app as waltz_app

#: A views module whose entity went to schema version 2 without an upcaster from version 1.
BUMPED = textwrap.dedent(
    """
    from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

    from waltz.jdbc_style import EntityRegistry, WaltzEntity, migrations_api
    from waltz.spark.views import AppViews, entity_table, replay


    class Base(DeclarativeBase):
        pass


    class Member(Base):
        __tablename__ = "bumped_members"
        __waltz__ = WaltzEntity("bumped_member", schema_version=2)
        member_id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
        score: Mapped[int]


    ENTITIES = EntityRegistry([Member])


    def build(changes, log):
        return {"bumped_members": entity_table(replay(changes), ENTITIES, Member)}


    def prepare(engine):
        migrations_api.upgrade(engine)
        Base.metadata.create_all(engine)


    VIEWS = AppViews(
        cluster_name="bumped",
        tables=[Member.__table__],
        prepare=prepare,
        build=build,
        entities=ENTITIES,
    )
    """
)

REFUSAL = (
    "error: bumped_member is schema version 2, but no upcaster reads version(s) 1: a log holding "
    "changes of those versions could not be read (declare what changed from each version to the next)"
)


@pytest.fixture
def bumped_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    package = tmp_path / "apps" / "bumped_app"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "views.py").write_text(BUMPED)
    monkeypatch.syspath_prepend(str(tmp_path / "apps"))
    return "bumped_app"


@pytest.mark.parametrize(
    "command",
    [
        ["snapshot", "verify", "{snapshot}", "--app", "{app}"],
        ["snapshot", "load", "{snapshot}", "--app", "{app}", "--url", "{url}"],
        ["rebuild", "--app", "{app}", "--check", "--storage-dir", "{snapshot}"],
    ],
    ids=["snapshot-verify", "snapshot-load", "rebuild-check"],
)
def test_a_schema_version_raised_without_an_upcaster_is_refused_naming_it(
    bumped_app: str, tmp_path: Path, command: list[str]
) -> None:
    (tmp_path / "snapshot").mkdir()
    values = {
        "app": bumped_app,
        "snapshot": str(tmp_path / "snapshot"),
        "url": f"sqlite:///{tmp_path / 'x.db'}",
    }
    result = CliRunner().invoke(
        waltz_app, [part.format(**values) for part in command], env={"COLUMNS": "300"}
    )
    assert result.exit_code == 2, result.output
    assert REFUSAL in " ".join(result.output.split()), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
