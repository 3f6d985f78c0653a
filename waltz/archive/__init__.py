"""The archive: the log's committed records in Parquet files on cheaper storage.

Source: docs/design/archive.md. The location of the archive's files is a directory or any URL
``pyarrow.fs`` opens (:mod:`waltz.archive.location`); pyarrow comes with the ``archive`` extra.
"""
