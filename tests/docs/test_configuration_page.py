"""docs/configuration.md names every setting of every settings class, by key, Python field and variable.

A user configures a process by a file's dotted key, an environment variable, or in Python by the
settings class's field: each table row gives all three, and this test holds the tables to the
classes (a new setting without a row, or a row naming a field that does not exist, fails).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from waltz.admin.config import ClusterAdminConfig
from waltz.client.config import WaltzClientConfig
from waltz.config import WaltzSettings
from waltz.console.config import ConsoleConfig
from waltz.services.server.config import ServerConfig
from waltz.services.storage.config import StorageConfig

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"

#: Each section of the page (by its heading's start), the class it documents, and the keys its
#: table must hold (None: every key of the class).
SECTIONS: list[tuple[str, type[WaltzSettings], str | None]] = [
    ("## Storage node", StorageConfig, None),
    ("## Server ", ServerConfig, None),
    ("## Cluster tool", ClusterAdminConfig, None),
    ("## Operator console", ConsoleConfig, "console."),  # it reads the cluster tool's keys too
    ("## Client ", WaltzClientConfig, None),
]

ROW = re.compile(r"^\| `(?P<key>[^`]+)` \| `(?P<field>[^`]+)` \| `(?P<env>[^`]+)`")


def _rows(heading: str) -> dict[str, tuple[str, str]]:
    rows: dict[str, tuple[str, str]] = {}
    inside = False
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            inside = line.startswith(heading)
        elif inside and (match := ROW.match(line)):
            rows[match["key"]] = (match["field"], match["env"])
    return rows


@pytest.mark.parametrize(("heading", "cls", "prefix"), SECTIONS, ids=[s[1].__name__ for s in SECTIONS])
def test_each_setting_has_a_row_with_its_field_and_variable(
    heading: str, cls: type[WaltzSettings], prefix: str | None
) -> None:
    rows = _rows(heading)
    expected = {k: f for k, f in cls.KEYS.items() if prefix is None or k.startswith(prefix)}
    assert expected, f"{cls.__name__} has no keys under {prefix!r}"
    missing = sorted(set(expected) - set(rows))
    assert not missing, f"docs/configuration.md {heading!r} lacks rows for {missing}"
    env_prefix = str(cls.model_config.get("env_prefix", ""))
    for key, field in expected.items():
        documented_field, documented_env = rows[key]
        assert documented_field == field, f"{key}: the page says field {documented_field}, the class {field}"
        assert documented_env == f"{env_prefix}{field}".upper(), f"{key}: variable {documented_env}"
    unknown = sorted(k for k in rows if k not in cls.KEYS)
    assert not unknown, f"docs/configuration.md {heading!r} documents keys {cls.__name__} lacks: {unknown}"
