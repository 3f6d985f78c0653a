"""The Waltz storage node: on-disk log, store-session fencing, gRPC storage and admin services.

Design: docs/design/storage.md "What a storage node does", "Files on disk", "Storage requests".
"""
