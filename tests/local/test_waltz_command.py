"""The ``waltz`` command that ``waltz up`` prints for the shell: this installation's, found on the
PATH by its name only when the PATH finds this installation's script (docs/local-cluster.md)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from waltz.local.security import _waltz_command

BESIDE = Path(sys.executable).parent / "waltz"

pytestmark = pytest.mark.skipif(not BESIDE.exists(), reason="no waltz script beside this interpreter")


def test_the_name_when_the_path_finds_this_installation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{BESIDE.parent}{os.pathsep}/usr/bin")
    assert _waltz_command() == "waltz"


def test_the_path_when_the_path_finds_none(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert _waltz_command() == str(BESIDE)


def test_the_path_when_the_path_finds_another_installation_first(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    other = tmp_path / "waltz"
    other.write_text("#!/bin/sh\necho another installation\n")
    other.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{BESIDE.parent}")
    assert _waltz_command() == str(BESIDE)
