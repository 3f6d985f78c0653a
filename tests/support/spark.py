"""Helpers of the tests that run a Spark standalone cluster on loopback (``waltz.local.spark``)."""

from __future__ import annotations

import os
from pathlib import Path

import support

import waltz
import waltz_examples
from waltz.local.spark import LocalSparkCluster

__all__ = ["local_spark_cluster", "python_path"]


def python_path() -> str:
    """A PYTHONPATH with this tree's waltz and waltz_examples first (for the workers and the driver)."""
    roots = [str(Path(waltz.__file__).parents[1]), str(Path(waltz_examples.__file__).parents[1])]
    existing = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys(roots + existing))


def local_spark_cluster(work_dir: Path) -> LocalSparkCluster:
    """A LocalSparkCluster of two workers whose Python imports this tree (skipped without PySpark)."""
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError:
        support.unavailable("pyspark/pyarrow are not installed (pip install -e '.[spark]')")
    return LocalSparkCluster(work_dir, workers=2, env={"PYTHONPATH": python_path()})
