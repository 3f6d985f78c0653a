"""The values a plan of the committed log is made of: its partitions, their committed high-water
marks and where their records are read from.

Source: docs/design/spark.md "Reading committed records only", "Live reads through admin ports",
"Offline reads from replica directories". :mod:`waltz.committed.plan` makes them (it talks to
ZooKeeper and the storage nodes); :mod:`waltz.committed.reads` and the Spark tasks read with
them, so this module imports nothing of the planning.
"""

from __future__ import annotations

from dataclasses import dataclass

from waltz.protocol.channels import TlsConfig

__all__ = ["CommittedPartition", "LiveReplica", "LiveSource", "OfflineReplica", "OfflineSource"]


@dataclass(frozen=True, slots=True)
class LiveReplica:
    """A replica in the partition's current store session, read through its admin port.

    Attributes:
        storage: the storage node's connect string (``host:port`` of its storage port).
        admin_address: ``host:admin_port``.
        low_water_mark: its low-water mark, set by the current session's recovery.
        max_transaction_id: the highest ID it held when the plan was made.
    """

    storage: str
    admin_address: str
    low_water_mark: int
    max_transaction_id: int


@dataclass(frozen=True, slots=True)
class LiveSource:
    """Where the committed records of a partition are read from on a live cluster.

    Attributes:
        cluster_key: the cluster key (UUID text), for the admin open.
        num_partitions: the cluster's number of partitions, for the admin open.
        session_id: the partition's store session when the plan was made.
        replicas: the replicas of that session that proved their state, highest max first.
        tls: client TLS files for the admin ports, or None.
        quorum: a majority of the partition's replicas (assigned or in its metadata): how many
            replicas a reader that compares them reads a record from.
        archive: the cluster's archive as ``<root>/archive`` names it (None: none yet); the
            ranges below the replicas' local start are read there (docs/design/archive.md,
            "Reads below the local start").
    """

    cluster_key: str
    num_partitions: int
    session_id: int
    replicas: tuple[LiveReplica, ...]
    tls: TlsConfig | None = None
    quorum: int = 1
    archive: str | None = None


@dataclass(frozen=True, slots=True)
class OfflineReplica:
    """A replica directory of a partition (``<storage dir>/<partition>``).

    Attributes:
        directory: the storage directory (holding ``waltz-storage.ctl``).
        session_id: the session that last set the replica's low-water mark (-1: none).
        low_water_mark: that low-water mark: every record up to it is committed.
        max_transaction_id: the highest ID of a valid record in the directory (-1: none).
    """

    directory: str
    session_id: int
    low_water_mark: int
    max_transaction_id: int


@dataclass(frozen=True, slots=True)
class OfflineSource:
    """Where the committed records of a partition are read from on disk.

    Attributes:
        replicas: the partition's replica directories given.
        quorum: identical records needed above every low-water mark (majority mode), or None in
            explicit mode (the user vouched for the high-water mark).
    """

    replicas: tuple[OfflineReplica, ...]
    quorum: int | None


@dataclass(frozen=True, slots=True)
class CommittedPartition:
    """A partition's committed high-water mark and where to read its records.

    Attributes:
        partition_id: the partition.
        high_water_mark: every record up to it is committed and readable (-1: empty).
        source: :class:`LiveSource` or :class:`OfflineSource`.
        proof: one line on how the mark was established (logged, shown by ``waltz rebuild``).
        first_transaction_id: the lowest ID its log holds: 0, or for a new partition of a split
            its genesis, ``B(p) + 1`` (docs/design/splits.md "Spark across a split").
    """

    partition_id: int
    high_water_mark: int
    source: LiveSource | OfflineSource
    proof: str
    first_transaction_id: int = 0
