"""The Waltz services (storage node, server node, cluster management) and the helpers that run them.

``waltz.services.processes`` starts and supervises OS child processes; ``local_zookeeper`` runs a
real standalone Apache ZooKeeper on loopback for tests, the demo and local clusters.
"""
