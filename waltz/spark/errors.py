"""Errors of the Spark reader and the rebuild job (all :class:`~waltz.errors.WaltzError`).

The errors of the committed reads are :mod:`waltz.committed.errors`'s, named here too.
"""

from __future__ import annotations

from waltz.committed.errors import CommittedReadError, CorruptRecordError, StorageDirectoryNotVisibleError
from waltz.errors import WaltzError

__all__ = [
    "CommittedReadError",
    "CorruptRecordError",
    "RebuildError",
    "SparkUnavailableError",
    "StorageDirectoryNotVisibleError",
]


class RebuildError(WaltzError):
    """The rebuild job could not compute or write the views (the old tables are left as they were)."""


class SparkUnavailableError(WaltzError, ImportError):
    """PySpark (or pyarrow) is not importable: install the ``spark`` extra
    (``pip install 'waltz-py[spark]'``)."""
