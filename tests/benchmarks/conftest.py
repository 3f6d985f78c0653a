"""Fixtures of the benchmark tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def quorum_tmp() -> Iterator[Path]:
    """A temporary directory of the test's own for ``PgQuorum``'s servers (``TMPDIR`` of a
    benchmark process, or ``tempfile.tempdir``), open to the ``postgres`` user as ``/tmp`` is: what
    a test finds left in it is its own, whatever another pytest worker runs meanwhile."""
    parent = Path(tempfile.mkdtemp(prefix="waltz-test-quorum-"))
    parent.chmod(0o755)
    try:
        yield parent
    finally:
        shutil.rmtree(parent, ignore_errors=True)
