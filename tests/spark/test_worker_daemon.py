"""The rebuild's Python workers are forked from waltz's worker daemon, which imported the modules
their tasks use before it forked (docs/design/spark.md "Computing views")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from waltz.spark.worker_daemon import PRELOADED


def test_the_daemon_preloads_every_module_it_names_and_nothing_of_the_planning() -> None:
    code = (
        "import json, sys\n"
        "from waltz.spark.worker_daemon import preload\n"
        "failed = preload()\n"
        "print(json.dumps([failed, sorted(sys.modules)]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    failed, loaded = json.loads(done.stdout)
    assert failed == []
    assert set(PRELOADED) <= set(loaded)
    assert [name for name in ("kazoo", "alembic", "waltz.committed.plan") if name in loaded] == []


def test_a_module_that_does_not_import_is_reported_not_raised() -> None:
    from waltz.spark.worker_daemon import preload

    assert preload(("json", "waltz.no_such_module")) == ["waltz.no_such_module"]


def test_the_session_forks_its_python_workers_from_the_daemon(spark: Any) -> None:
    """A task's worker is a child of ``python -m waltz.spark.worker_daemon`` and holds the
    decoders without having imported them itself."""

    def parent_and_modules(_: Any) -> list[tuple[str, bool]]:
        import os

        parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        return [(parent, "waltz.spark.decoders" in sys.modules)]

    rows = spark.sparkContext.parallelize(range(2), 2).mapPartitions(parent_and_modules).collect()
    assert rows
    for parent, decoders in rows:
        assert "-m waltz.spark.worker_daemon" in parent
        assert decoders
