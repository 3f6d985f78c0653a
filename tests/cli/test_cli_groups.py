"""The ``waltz`` command imports its heavy sub-command groups only when they are used."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from waltz.cli.groups import HELP
from waltz.cli.main import app

HEAVY = ("sqlalchemy", "alembic", "kazoo", "waltz.cli.db", "waltz.cli.cluster", "waltz.cli.disk")


def _imported_after(code: str) -> set[str]:
    """The HEAVY modules a fresh interpreter has imported after running ``code``."""
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    return set(result.stdout.split())


def test_the_top_level_help_lists_every_group_without_importing_the_heavy_ones() -> None:
    code = (
        "from typer.testing import CliRunner\n"
        "from waltz.cli.main import app\n"
        "result = CliRunner().invoke(app, ['--help'], terminal_width=200)\n"
        "assert result.exit_code == 0, result.output\n"
        "assert all(name in result.output for name in ('disk', 'cluster', 'db', 'perf', 'up'))\n"
    )
    assert _imported_after(code) == set()


def test_a_group_is_imported_when_it_runs() -> None:
    code = (
        "from typer.testing import CliRunner\n"
        "from waltz.cli.main import app\n"
        "result = CliRunner().invoke(app, ['db', '--help'])\n"
        "assert result.exit_code == 0, result.output\n"
    )
    imported = _imported_after(code)
    assert {"waltz.cli.db", "sqlalchemy", "alembic"} <= imported
    assert "waltz.cli.cluster" not in imported


def test_each_lazy_group_shows_its_own_help_and_commands() -> None:
    runner = CliRunner()
    expected = {"disk": "verify", "cluster": "create", "db": "upgrade"}
    for name, command in expected.items():
        result = runner.invoke(app, [name, "--help"])
        assert result.exit_code == 0, result.output
        assert " ".join(HELP[name].split()[:4]) in " ".join(result.output.split())
        assert command in result.output


def test_commands_whose_optional_dependency_is_missing_say_which_extra_to_install() -> None:
    code = (
        "import sys\n"
        "sys.modules['sqlalchemy'] = None  # as if waltz-py was installed without the sql extra\n"
        "from typer.testing import CliRunner\n"
        "from waltz.cli.main import app\n"
        "for args in (['db', 'current', '--url', 'sqlite://'], ['rebuild', '--app', 'x', '--db', 'sqlite://']):\n"
        "    result = CliRunner().invoke(app, args)\n"
        "    print(result.exit_code, ' '.join(result.output.split()))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    db, rebuild = run.stdout.splitlines()
    assert db.startswith("2 ") and "pip install 'waltz-py[sql]'" in db, run.stdout + run.stderr
    assert rebuild.startswith("2 ") and "install waltz-py[sql,spark]" in rebuild, run.stdout
    assert "Traceback" not in run.stdout


def test_an_unknown_command_is_still_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["dbb"])
    assert result.exit_code == 2
    assert "db" in result.output


def _waltz_without(modules: tuple[str, ...], args: list[str]) -> subprocess.CompletedProcess[str]:
    """``waltz ARGS`` (the console script's own entry, :func:`waltz.cli.main.main`) in a fresh
    interpreter where ``modules`` cannot be imported, as if their extra were not installed."""
    code = (
        "import sys\n"
        f"for name in {modules!r}:\n"
        "    sys.modules[name] = None\n"
        "from waltz.cli.main import main\n"
        f"main({args!r})\n"
    )
    command = [sys.executable, "-c", code]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_commands_that_import_an_extra_as_they_run_say_which_extra_to_install(tmp_path: Path) -> None:
    """Commands listed with waltz-py's own (demo, perf, snapshot's sub-commands) import SQLAlchemy
    as they run: without the sql extra they end with what to install, not a traceback."""
    for args in (
        ["snapshot", "show", str(tmp_path)],
        ["demo", "--no-spark", "--work-dir", str(tmp_path / "demo")],
        ["perf", "smallbank", "--local", "-n", "10"],
    ):
        run = _waltz_without(("sqlalchemy",), args)
        said = " ".join(run.stderr.split())
        assert run.returncode == 2, run.stdout + run.stderr
        assert f"error: waltz {args[0]} cannot run: SQLAlchemy is not installed here" in said, said
        assert "pip install 'waltz-py[sql]'" in said and "Traceback" not in said, said
    assert not (tmp_path / "demo").exists() or not any((tmp_path / "demo").iterdir())
    # A module missing that no extra brings is a defect: its traceback stays.
    run = _waltz_without(("waltz.workloads.demo",), ["demo", "--no-spark"])
    assert run.returncode == 1 and "Traceback" in run.stderr and "ModuleNotFoundError" in run.stderr


def test_the_demo_without_spark_says_so_before_it_starts_anything(tmp_path: Path) -> None:
    run = _waltz_without(("pyspark",), ["demo", "--work-dir", str(tmp_path / "demo")])
    said = " ".join(run.stderr.split())
    assert run.returncode == 2, run.stdout + run.stderr
    assert "the demo ends with a Spark rebuild of the ledger, and pyspark is not installed here" in said
    assert "pip install 'waltz-py[spark]'" in said and "--no-spark" in said, said
    assert not (tmp_path / "demo").exists()  # refused before the cluster and its directory


def test_an_installed_extra_is_never_blamed_for_an_import_that_fails_inside_it() -> None:
    """SQLAlchemy is installed here: a name it lacks (another version) or a submodule it lacks is
    a defect to see in full, not an extra to install."""
    from waltz.cli.output import missing_extra

    for error in (
        ImportError("cannot import name 'X' from 'sqlalchemy'", name="sqlalchemy"),
        ModuleNotFoundError("No module named 'sqlalchemy.nope'", name="sqlalchemy.nope"),
        ModuleNotFoundError("No module named 'sqlalchemy'", name="sqlalchemy"),  # yet it is here
        ModuleNotFoundError("No module named 'nothing_of_ours'", name="nothing_of_ours"),
    ):
        assert missing_extra(error) is None, error
