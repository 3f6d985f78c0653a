"""The operator tools behind ``waltz cluster``: create and delete a cluster, assign storage nodes
and replicas, verify replicas and servers, recover a partition.
"""
