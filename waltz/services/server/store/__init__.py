"""The replicated store: append queues, store sessions, replica sessions, recovery and quorum voting.

Design: docs/design/server.md "Store partition", "Store sessions"; docs/design/recovery.md "When a
recovery runs" and the sections after it, notably "Quorum checking with offline replicas" and
"Undecidable high-water mark".
"""
