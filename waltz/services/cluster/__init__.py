"""Cluster management on ZooKeeper: the znode layout, metadata codecs, cluster manager.

Source: seed 000 "Zookeeper", "Partition Metadata", "Replica Assignments"; seed 003 "Partition
Metadata"; seed 004 "Replica Assignments", "Group Descriptor". ``docs/zookeeper.md`` documents
every znode.
"""
