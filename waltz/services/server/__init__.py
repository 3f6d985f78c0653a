"""The Waltz server: partitions (append and feed), the lock table, and the replicated store.

Source: seed 000 "Waltz Server", seed 003.
"""
