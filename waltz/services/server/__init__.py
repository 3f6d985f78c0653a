"""The Waltz server: partitions (append and feed), the lock table, and the replicated store.

Design: docs/design/server.md "What a server does"; docs/design/recovery.md "When a recovery runs".
"""
