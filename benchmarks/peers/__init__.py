"""waltz-py against its peers and the machine's limits: ``python -m benchmarks.peers.run_all``.

One module per system (``bench_*``), the SmallBank peers' shared parts (``smallbank_*``) and the
PostgreSQL servers they run against (``pg_server``: the local one, or a primary with two
synchronous standbys started for a run, ``pg_quorum``).
"""
