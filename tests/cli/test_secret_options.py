"""Database URLs (with their passwords) come from an environment variable or a file too, never only
from the command line, which every user of the machine sees in ``ps``."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from waltz.cli.main import app
from waltz.cli.options import secret_value

URL = "postgresql+psycopg://app:s3cret@127.0.0.1:5432/app"


def test_a_secret_comes_from_the_first_line_of_its_file(tmp_path: Path) -> None:
    file = tmp_path / "db-url"
    file.write_text(f"  {URL}  \nsecond line\n")
    assert secret_value(None, file, "--db") == URL
    assert secret_value(URL, None, "--db") == URL
    assert secret_value(None, None, "--db", required=False) is None


@pytest.mark.parametrize(
    ("value", "content", "says"),
    [
        (URL, URL, "give --db or --db-file, not both"),
        (None, "\n", "--db-file .* is empty"),
        (None, None, "--db-file .*: cannot read it"),
    ],
)
def test_a_bad_secret_file_is_refused_with_its_name(
    tmp_path: Path, value: str | None, content: str | None, says: str
) -> None:
    file = tmp_path / "db-url"
    if content is not None:
        file.write_text(content)
    with pytest.raises(typer.BadParameter, match=says):
        secret_value(value, file, "--db")


def test_rebuild_takes_its_urls_from_the_environment(tmp_path: Path) -> None:
    file = tmp_path / "db-url"
    file.write_text(URL)
    runner = CliRunner()  # wide: rich wraps errors at the terminal width
    # The variable is read: with the file as well, the two are refused together.
    result = runner.invoke(
        app,
        ["rebuild", "--app", "waltz_examples.ledger", "--verify-against-file", str(file)],
        env={"WALTZ_REBUILD_VERIFY_AGAINST": URL, "COLUMNS": "300"},
    )
    assert result.exit_code == 2, result.output
    assert "give --verify-against or --verify-against-file, not both" in result.output
    result = runner.invoke(
        app,
        ["rebuild", "--app", "waltz_examples.ledger"],
        env={"WALTZ_REBUILD_DB_FILE": str(tmp_path / "none"), "COLUMNS": "300"},
    )
    assert result.exit_code == 2, result.output
    assert "--db-file" in result.output and "cannot read it" in result.output


def test_snapshot_takes_its_url_from_a_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("")
    result = CliRunner().invoke(
        app,
        ["snapshot", "create", str(tmp_path / "snap"), "--app", "waltz_examples.ledger"],
        env={"WALTZ_DB_URL_FILE": str(empty), "COLUMNS": "300"},
    )
    assert result.exit_code == 2, result.output
    assert "--url-file" in result.output and "is empty" in result.output
