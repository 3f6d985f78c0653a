"""Finding a SmallBank application by its module's name (``--app``), and the ledger as one."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from waltz.errors import ConfigurationError
from waltz.workloads.application import DEFAULT_APPLICATION, SmallBankApplication, load_application


def test_the_default_application_is_the_ledger_example() -> None:
    app = load_application(DEFAULT_APPLICATION)
    assert isinstance(app, SmallBankApplication)
    assert app.name == "ledger"
    assert {"ledger_accounts", "ledger_applied_transactions", "ledger_alembic_version"} <= app.tables
    assert not any(table.startswith("waltz_") for table in app.tables)  # the framework's are not its own


def test_an_application_defined_in_the_module_itself_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "bank_of_the_test.py").write_text("from waltz_examples.ledger.smallbank import SMALLBANK\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_application("bank_of_the_test") is load_application(DEFAULT_APPLICATION)


def test_a_module_without_an_application_is_refused_saying_what_to_give() -> None:
    expected = r"neither waltz_examples\.counter\.smallbank nor waltz_examples\.counter defines SMALLBANK"
    with pytest.raises(ConfigurationError, match=expected):
        load_application("waltz_examples.counter")
    with pytest.raises(ConfigurationError, match=r"no module named 'no_such_bank_anywhere' \(searched"):
        load_application("no_such_bank_anywhere")


def test_a_local_package_is_found_from_its_directory_without_pythonpath(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--app`` finds a package in the working directory, as ``python -m`` would, and hands the
    directory to the processes a command starts (Spark's workers, perf's instances)."""
    package = tmp_path / "inventory_service"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "smallbank.py").write_text("from waltz_examples.ledger.smallbank import SMALLBANK\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert load_application("inventory_service") is load_application(DEFAULT_APPLICATION)
    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path)


def test_an_application_missing_one_of_its_own_imports_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_bank.py").write_text("import a_dependency_nobody_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="a_dependency_nobody_installed"):
        load_application("broken_bank")
