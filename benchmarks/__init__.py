"""The benchmarks of waltz-py: scripts that measure parts of it, and it against its peers.

Each module with a ``main`` is run as a module from the repository's root, e.g.
``.venv/bin/python -m benchmarks.sql_apply``; none asserts anything, they print figures
(docs/benchmarks.md; the figures and their history are in ``benchmarks/RESULTS.md``).
"""
