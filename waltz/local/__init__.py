"""Local clusters for the demo, tests and benchmarks: ZooKeeper, storage nodes and servers as
processes on loopback (:class:`~waltz.local.cluster.LocalCluster`), and the helpers that start and
supervise them.
"""
