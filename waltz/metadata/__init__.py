"""The cluster's metadata in ZooKeeper, shared by servers, clients, operator tools and Spark.

The znode layout (:mod:`waltz.metadata.zk`), the values stored in the znodes
(:mod:`waltz.metadata.values`), the partition assignment (:mod:`waltz.metadata.assignment`), the
rules of replica sets (:mod:`waltz.metadata.replicas`) and the ZooKeeper session helpers
(:mod:`waltz.metadata.zk_session`). ``docs/zookeeper.md`` documents every znode.
"""
