"""A storage node's files are its user's only, whatever the umask (docs/design/storage.md, "File modes")."""

from __future__ import annotations

import logging
import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from waltz.services.storage import format as fmt
from waltz.services.storage.node import StorageNode

pytestmark = pytest.mark.security


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The most open umask a process may have: nothing the node creates may depend on it."""
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_files_are_0600_and_directories_0700_whatever_the_umask(tmp_path: Path, open_umask: None) -> None:
    directory = tmp_path / "new" / "storage"
    with StorageNode(directory) as node:
        node.admin_open(str(uuid.uuid4()), 2)
        node.set_assignment(0, True)
    assert _mode(directory) == 0o700 and _mode(directory.parent) == 0o700
    assert _mode(directory / fmt.CONTROL_FILE_NAME) == 0o600
    assert _mode(directory / "0") == 0o700
    segments = sorted((directory / "0").iterdir())
    assert [p.suffix for p in segments] == [fmt.INDEX_SUFFIX, fmt.SEGMENT_SUFFIX]
    assert {_mode(p) for p in segments} == {0o600}


def test_older_open_files_are_narrowed_and_an_open_storage_directory_is_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A node written before its files were private: the partition directories and the control
    file become private when it starts; the storage directory, which the operator chose, keeps its
    mode and the node says to narrow it."""
    directory = tmp_path / "storage"
    with StorageNode(directory) as node:
        node.admin_open(str(uuid.uuid4()), 1)
        node.set_assignment(0, True)
    control = directory / fmt.CONTROL_FILE_NAME
    for path, mode in ((directory, 0o755), (directory / "0", 0o755), (control, 0o644)):
        os.chmod(path, mode)
    with caplog.at_level(logging.WARNING, logger="waltz.services.storage.node"), StorageNode(directory):
        pass
    assert _mode(directory / "0") == 0o700
    assert _mode(directory / fmt.CONTROL_FILE_NAME) == 0o600
    assert _mode(directory) == 0o755
    assert any("chmod 700" in r.getMessage() and str(directory) in r.getMessage() for r in caplog.records)
