"""Committed reads: which records of the log a quorum proves committed, and reading them, checked.

Source: docs/design/spark.md "Reading committed records only", "Live reads through admin ports",
"Offline reads from replica directories". Plain Python over the admin ports and the storage
file format: the Spark data source and the archiver read the log through it.

- :mod:`waltz.committed.plan`: each partition's committed high-water mark and where to read it
  (:func:`~waltz.committed.plan.plan_live`, :func:`~waltz.committed.plan.plan_offline`).
- :mod:`waltz.committed.reads`: the records of a proven range, CRC-checked
  (:func:`~waltz.committed.reads.read_committed`).
- :mod:`waltz.committed.errors`: what a committed read raises.
"""
