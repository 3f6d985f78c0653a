"""PySpark's Python worker daemon, with the modules a rebuild's tasks use imported before it forks.

Source: docs/design/spark.md "Computing views". Spark starts one daemon per executor and forks a
Python worker from it for each task slot (again when an idle worker was stopped). A worker imports
what a task needs when it first runs one: for a rebuild, the ``waltz`` data source's reads and the
decoders (about 0.6 s of CPU, more on a loaded machine), paid on the critical path of every stage
that starts workers. A daemon that has imported them forks workers that hold them already.

:func:`waltz.spark.session.spark_session` names this module in ``spark.python.daemon.module``
(Spark's setting for a daemon of one's own); it runs PySpark's own daemon, unchanged, after
:func:`preload`. A module that fails to import is logged and left to the task that needs it, which
reports the error where Spark reports task errors.
"""

from __future__ import annotations

import importlib
import logging
import sys

__all__ = ["PRELOADED", "preload"]

log = logging.getLogger(__name__)

#: What a rebuild's tasks import: the data source's reads, the decoders and their change-set
#: codec and upcasters, the views' helpers, and the libraries under them. Nothing here starts a
#: thread or opens a socket at import, so forking after it is safe.
PRELOADED = (
    "pyarrow",
    "sqlalchemy.orm",
    "waltz.committed.reads",
    "waltz.jdbc_style.changeset",
    "waltz.jdbc_style.upcasting",
    "waltz.spark.archived",
    "waltz.spark.decoders",
    "waltz.spark.source",
    "waltz.spark.views",
)


def preload(modules: tuple[str, ...] = PRELOADED) -> list[str]:
    """Import ``modules``; returns those that failed (logged, not raised: a task that needs one
    fails with the import's own error)."""
    failed: list[str] = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # logged; the task that needs the module reports it
            log.warning("the Spark worker daemon could not preload %s", name, exc_info=True)
            failed.append(name)
    return failed


def main() -> None:
    """Preload, then run PySpark's daemon (its arguments, such as the worker module, unchanged)."""
    preload()
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()
    sys.exit(0)
