"""What a Spark task imports: the modules it reads and decodes the log with, and nothing of the
driver's planning or of the client.

A Python worker imports these modules when it first runs a task of a rebuild (and again whenever
Spark starts a new worker), so every module they pull in is paid per worker, on the rebuild's
critical path (docs/design/spark.md "Computing views"). The packages ``waltz.client`` and
``waltz.jdbc_style`` import their modules on first use for the same reason; every public name of
theirs must still resolve.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

#: What a task reads and decodes the log with: the data source, its reads, the decoders.
TASK_MODULES = ("waltz.spark.source", "waltz.spark.decoders", "waltz.spark.archived", "waltz.committed.reads")

#: The driver's planning (ZooKeeper, the storage nodes' admin calls), the client and the
#: framework's migrations: none of them is a task's.
NOT_A_TASKS = (
    "kazoo",
    "alembic",
    "pydantic",
    "waltz.client.client",
    "waltz.committed.plan",
    "waltz.metadata.zk",
    "waltz.jdbc_style.callbacks",
)


def _imported_after(modules: tuple[str, ...]) -> set[str]:
    """The modules a fresh interpreter holds after importing ``modules``."""
    code = (
        "import importlib, json, sys\n"
        f"for name in {list(modules)!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    command = [sys.executable, "-c", code]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    return set(json.loads(done.stdout))


def test_a_task_imports_neither_the_planning_nor_the_client() -> None:
    loaded = _imported_after(TASK_MODULES)
    assert set(TASK_MODULES) <= loaded
    assert sorted(name for name in NOT_A_TASKS if name in loaded) == []


def test_the_change_set_form_imports_no_apply_machinery() -> None:
    loaded = _imported_after(("waltz.jdbc_style.changeset",))
    assert sorted(name for name in NOT_A_TASKS if name in loaded) == []


@pytest.mark.parametrize("package", ["waltz.client", "waltz.jdbc_style"])
def test_every_public_name_of_a_lazy_package_resolves(package: str) -> None:
    module = importlib.import_module(package)
    for name in module.__all__:
        value = getattr(module, name)
        assert getattr(value, "__name__", name) == name or not callable(value), (package, name)
    assert set(module.__all__) <= set(dir(module))
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        module.NoSuchName  # noqa: B018 - the attribute access is the test
