"""Spark over the Waltz log: the ``waltz`` data source and the rebuild of an application's views.

Source: docs/design/spark.md "What the rebuild is for"; docs/design/overview.md "Why the log is the
source of truth" (the log is the source of truth, databases derive from it); ``docs/spark.md`` is
the guide. Importing :mod:`waltz.spark.source` needs PySpark and pyarrow (the ``spark`` extra);
:mod:`waltz.committed`, which plans and reads the committed records, does not.

- :func:`register`: register the ``waltz`` data source with a Spark session.
- :mod:`waltz.spark.decoders`: transaction data to row changes (change-sets, command decoders).
- :mod:`waltz.spark.views`: replay row changes into tables (last write per key wins).
- :mod:`waltz.spark.rebuild`: the rebuild job (``waltz rebuild``); :mod:`waltz.spark.target`:
  writing the views into a database; :mod:`waltz.spark.drift`: the drift check (``--verify-against``).
"""

from __future__ import annotations

from waltz.spark.session import register

__all__ = ["register"]
