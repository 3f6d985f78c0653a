"""The Waltz storage node: on-disk log, store-session fencing, gRPC storage and admin services.

Source: seed 000 "On Disk Data Structures" and "Waltz Storage"; seed 004.
"""
