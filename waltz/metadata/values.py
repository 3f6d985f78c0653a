"""Metadata values stored in ZooKeeper, and their JSON codecs.

Design: docs/design/zookeeper.md "Partition metadata" (generation, store session ID, replica states
with closing high-water marks), "Replica assignments and groups" (replica assignments, group
descriptor), "The archive's summary" (the archive's location and what it holds). Every value is
a frozen dataclass with ``encode()`` (UTF-8 JSON, sorted keys) and ``decode(data, path)``; a
znode that does not decode raises :class:`~waltz.errors.MetadataError` naming the znode.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Self

from waltz.errors import MetadataError

__all__ = [
    "DISCOVERY_SPLIT_FORMAT",
    "FORMAT_VERSION",
    "ArchiveSummary",
    "ArchivedPartition",
    "ClusterParams",
    "ConnectionMetadata",
    "DiscoveryParams",
    "GroupDescriptor",
    "PartitionMetadata",
    "ReplicaAssignments",
    "ReplicaState",
]

FORMAT_VERSION = 1


def _load(data: bytes, path: str, formats: tuple[int, ...] = (FORMAT_VERSION,)) -> dict[str, Any]:
    """The znode's JSON object, refusing a ``format_version`` not in ``formats``, of another type
    than an integer, or missing (every form waltz-py wrote has one: docs/zookeeper.md "Encoding")."""
    try:
        value = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        # ValueError: not UTF-8 or not JSON, or an integer past Python's digit limit;
        # RecursionError: nesting deeper than the interpreter's stack.
        raise MetadataError(f"znode {path} does not hold JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise MetadataError(f"znode {path} holds {type(value).__name__}, expected an object")
    if "format_version" not in value:
        raise MetadataError(f"znode {path} lacks the field 'format_version': waltz-py did not write it")
    version = value["format_version"]
    if type(version) is not int or version not in formats:
        reads = " or ".join(str(f) for f in formats)
        raise MetadataError(f"znode {path} has format version {version}; this waltz-py reads {reads}")
    return value


def _dump(value: dict[str, Any]) -> bytes:
    return json.dumps({"format_version": FORMAT_VERSION, **value}, sort_keys=True).encode("utf-8")


#: ``server/preferred`` holding no server's entry, as a cluster made with role credentials (or
#: moved to them) starts it, so that no server can create it (docs/design/zookeeper.md, "Roles").
NO_PREFERRED_PARTITIONS: bytes = _dump({"servers": {}})


def _field(value: Mapping[str, Any], key: str, kind: type, path: str) -> Any:
    if key not in value:
        raise MetadataError(f"znode {path} lacks the field {key!r}")
    item = value[key]
    if kind is int and (isinstance(item, bool) or not isinstance(item, int)):
        raise MetadataError(f"znode {path}: field {key!r} is {item!r}, expected an integer")
    if kind is not int and not isinstance(item, kind):
        raise MetadataError(f"znode {path}: field {key!r} is {item!r}, expected {kind.__name__}")
    return item


def check_connect_string(connect_string: str) -> str:
    """Check a storage node connect string (``host:port``) and return it.

    Raises:
        MetadataError: it is not ``host:port`` with a port in 1..65535.
    """
    host, _, port = connect_string.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise MetadataError(f"{connect_string!r} is not a connect string of the form host:port")
    return connect_string


def check_zookeeper_connect_string(connect_string: str) -> str:
    """Check a ZooKeeper connect string, ``host:port[,host:port...][/chroot]``, and return it
    (docs/zookeeper.md); each ``host:port`` as :func:`check_connect_string` checks it.

    Raises:
        MetadataError: it is empty, or a member is not ``host:port`` with a port in 1..65535.
    """
    hosts = connect_string.partition("/")[0]
    try:
        for member in hosts.split(","):
            check_connect_string(member.strip())
    except MetadataError:
        raise MetadataError(
            f"{connect_string!r} is not a ZooKeeper connect string: host:port[,host:port...][/chroot] "
            "with ports in 1..65535, e.g. 127.0.0.1:2181"
        ) from None
    return connect_string


@dataclass(frozen=True, slots=True)
class ClusterParams:
    """The cluster's parameters: name, number of partitions and the cluster key.

    The key stays out of the value's ``repr`` (a logged value never shows it: docs/design/overview.md,
    "The cluster key").
    """

    name: str
    num_partitions: int
    cluster_key: uuid.UUID = field(repr=False)

    def encode(self) -> bytes:
        return _dump(
            {"name": self.name, "num_partitions": self.num_partitions, "cluster_key": str(self.cluster_key)}
        )

    @classmethod
    def decode(cls, data: bytes, path: str) -> Self:
        value = _load(data, path)
        try:
            key = uuid.UUID(_field(value, "cluster_key", str, path))
        except ValueError as exc:
            raise MetadataError(f"znode {path}: cluster_key is not a UUID") from exc
        return cls(_field(value, "name", str, path), _field(value, "num_partitions", int, path), key)


#: The format of ``<root>/discovery`` once a cluster's first split started: it adds ``epoch``, so
#: that a client that reads format 1 only refuses the cluster instead of routing by a count that
#: is no longer the cluster's (docs/design/splits.md "What ZooKeeper holds").
DISCOVERY_SPLIT_FORMAT = 2


@dataclass(frozen=True, slots=True)
class DiscoveryParams:
    """What a client needs of the cluster parameters: the name and the number of partitions.

    Kept in ``<root>/discovery``, which clients may read, apart from ``<root>/cluster``, which
    holds the cluster key and which they may not (docs/design/zookeeper.md, "Security").

    Attributes:
        name: the cluster's name.
        num_partitions: the partition count the cluster was created with (epoch 0); a split
            leaves it as it is (the counts of later epochs are in ``partitions/epochs``).
        epoch: the newest epoch of ``partitions/epochs``, finished or not (0: no split started).
            With 0 the znode has format 1, as before splits existed; from 1 on it has format
            :data:`DISCOVERY_SPLIT_FORMAT` and an ``epoch`` field (docs/design/splits.md "What
            ZooKeeper holds", "The handover" step 2).
    """

    name: str
    num_partitions: int
    epoch: int = 0

    @classmethod
    def of(cls, params: ClusterParams) -> Self:
        """The discovery part of the cluster parameters (epoch 0)."""
        return cls(params.name, params.num_partitions)

    def encode(self) -> bytes:
        value: dict[str, Any] = {"name": self.name, "num_partitions": self.num_partitions}
        if self.epoch == 0:
            return _dump(value)
        return json.dumps(
            {**value, "format_version": DISCOVERY_SPLIT_FORMAT, "epoch": self.epoch}, sort_keys=True
        ).encode("utf-8")

    @classmethod
    def decode(cls, data: bytes, path: str) -> Self:
        """Read format 1 (no split started) or :data:`DISCOVERY_SPLIT_FORMAT` (with ``epoch``).

        Raises:
            MetadataError: another format, a field missing or of the wrong type, or an epoch
                below 1 in format 2.
        """
        value = _load(data, path, (FORMAT_VERSION, DISCOVERY_SPLIT_FORMAT))
        name, count = _field(value, "name", str, path), _field(value, "num_partitions", int, path)
        if value.get("format_version", FORMAT_VERSION) == FORMAT_VERSION:
            return cls(name, count)
        epoch = _field(value, "epoch", int, path)
        if epoch < 1:
            raise MetadataError(f"znode {path}: field 'epoch' is {epoch}, expected 1 or more in format 2")
        return cls(name, count, epoch)


@dataclass(frozen=True, slots=True)
class ReplicaAssignments:
    """Which storage node holds a replica of which partition.

    See docs/design/zookeeper.md "Replica assignments and groups".

    Attributes:
        replicas: storage connect string (``host:port``) -> sorted partition IDs.
    """

    replicas: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def encode(self) -> bytes:
        return _dump({"replicas": {k: list(v) for k, v in sorted(self.replicas.items())}})

    @classmethod
    def decode(cls, data: bytes, path: str) -> Self:
        raw = _field(_load(data, path), "replicas", dict, path)
        replicas: dict[str, tuple[int, ...]] = {}
        for storage, partitions in raw.items():
            check_connect_string(storage)
            if not isinstance(partitions, list) or not all(isinstance(p, int) for p in partitions):
                raise MetadataError(f"znode {path}: partitions of {storage} are {partitions!r}")
            replicas[storage] = tuple(sorted(partitions))
        return cls(replicas)

    def storages_of(self, partition_id: int) -> list[str]:
        """The connect strings of the storage nodes holding a replica of ``partition_id``, sorted."""
        return sorted(s for s, partitions in self.replicas.items() if partition_id in partitions)

    def with_replica(self, storage: str, partition_id: int, assigned: bool) -> ReplicaAssignments:
        """Return a copy with the replica of ``partition_id`` on ``storage`` added or removed."""
        replicas = dict(self.replicas)
        current = set(replicas.get(storage, ()))
        if assigned:
            current.add(partition_id)
        else:
            current.discard(partition_id)
        replicas[storage] = tuple(sorted(current))
        return ReplicaAssignments(replicas)


@dataclass(frozen=True, slots=True)
class GroupDescriptor:
    """Storage connect string -> replica group ID.

    See docs/design/zookeeper.md "Replica assignments and groups" (the group descriptor).
    """

    groups: Mapping[str, int] = field(default_factory=dict)

    def encode(self) -> bytes:
        return _dump({"groups": dict(sorted(self.groups.items()))})

    @classmethod
    def decode(cls, data: bytes, path: str) -> Self:
        raw = _field(_load(data, path), "groups", dict, path)
        for storage, group in raw.items():
            check_connect_string(storage)
            if isinstance(group, bool) or not isinstance(group, int):
                raise MetadataError(f"znode {path}: group of {storage} is {group!r}")
        return cls(dict(raw))


@dataclass(frozen=True, slots=True)
class ConnectionMetadata:
    """Storage connect string -> admin port of that storage node."""

    admin_ports: Mapping[str, int] = field(default_factory=dict)

    def encode(self) -> bytes:
        return _dump({"admin_ports": dict(sorted(self.admin_ports.items()))})

    @classmethod
    def decode(cls, data: bytes, path: str) -> Self:
        raw = _field(_load(data, path), "admin_ports", dict, path)
        for storage, port in raw.items():
            check_connect_string(storage)
            if isinstance(port, bool) or not isinstance(port, int):
                raise MetadataError(f"znode {path}: admin port of {storage} is {port!r}")
        return cls(dict(raw))

    def admin_address(self, storage: str) -> str:
        """The ``host:admin_port`` of a storage node.

        Raises:
            MetadataError: the storage node has no admin port on record.
        """
        port = self.admin_ports.get(storage)
        if port is None:
            raise MetadataError(f"storage node {storage} has no admin port in store/connection")
        return f"{storage.rpartition(':')[0]}:{port}"


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """The state of one replica of a partition (docs/design/zookeeper.md "Partition metadata").

    Attributes:
        session_id: the store session this replica is engaged in (-1: none yet).
        closing_high_water_mark: the high-water mark at which that session closed, set by the
            recovery of a later session that did not reach this replica; None while unresolved
            (``ReplicaState.UNRESOLVED`` in the original design).
    """

    session_id: int
    closing_high_water_mark: int | None = None

    @property
    def unresolved(self) -> bool:
        """True when the closing high-water mark is not set."""
        return self.closing_high_water_mark is None


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    """Partition metadata at ``store/partition/<id>`` (docs/design/zookeeper.md "Partition metadata").

    Attributes:
        generation: the generation of the server that created the current store session.
        session_id: the current store session ID (-1: no session yet).
        replicas: storage connect string -> replica state, for the replicas of the last session.
    """

    generation: int
    session_id: int
    replicas: Mapping[str, ReplicaState] = field(default_factory=dict)

    def encode(self) -> bytes:
        return _dump(
            {
                "generation": self.generation,
                "session_id": self.session_id,
                "replicas": {
                    storage: {
                        "session_id": state.session_id,
                        "closing_high_water_mark": state.closing_high_water_mark,
                    }
                    for storage, state in sorted(self.replicas.items())
                },
            }
        )

    @classmethod
    def decode(cls, data: bytes, path: str) -> Self:
        value = _load(data, path)
        replicas: dict[str, ReplicaState] = {}
        for storage, raw in _field(value, "replicas", dict, path).items():
            check_connect_string(storage)
            if not isinstance(raw, dict):
                raise MetadataError(f"znode {path}: replica state of {storage} is {raw!r}")
            closing = raw.get("closing_high_water_mark")
            if closing is not None and (isinstance(closing, bool) or not isinstance(closing, int)):
                raise MetadataError(f"znode {path}: closing high-water mark of {storage} is {closing!r}")
            replicas[storage] = ReplicaState(_field(raw, "session_id", int, path), closing)
        return cls(_field(value, "generation", int, path), _field(value, "session_id", int, path), replicas)

    def evolve(self, **changes: Any) -> PartitionMetadata:
        """Return a copy with some fields changed."""
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class ArchivedPartition:
    """What the archive holds of one partition (docs/design/zookeeper.md "The archive's summary").

    Attributes:
        archived_through: every transaction up to it is in the archive, verified (-1: none).
        chunks: the partition's chunks in the archive.
        size_bytes: their bytes in all (``bytes`` in the znode).
    """

    archived_through: int = -1
    chunks: int = 0
    size_bytes: int = 0


@dataclass(frozen=True, slots=True)
class ArchiveSummary:
    """The archive's summary at ``<root>/archive`` (docs/design/zookeeper.md "The archive's summary").

    Attributes:
        location: the archive: a directory or a URL ``pyarrow.fs`` opens.
        partitions: partition ID -> what the archive holds of it (a partition without an entry:
            nothing).
    """

    location: str
    partitions: Mapping[int, ArchivedPartition] = field(default_factory=dict)

    def of(self, partition_id: int) -> ArchivedPartition:
        """What the archive holds of a partition (nothing when it has no entry)."""
        return self.partitions.get(partition_id, ArchivedPartition())

    def with_partition(self, partition_id: int, value: ArchivedPartition) -> ArchiveSummary:
        """Return a copy with one partition's entry set."""
        return ArchiveSummary(self.location, {**self.partitions, partition_id: value})

    def encode(self) -> bytes:
        return _dump(
            {
                "location": self.location,
                "partitions": {
                    str(pid): {
                        "archived_through": p.archived_through,
                        "chunks": p.chunks,
                        "bytes": p.size_bytes,
                    }
                    for pid, p in sorted(self.partitions.items())
                },
            }
        )

    @classmethod
    def decode(cls, data: bytes, path: str) -> Self:
        value = _load(data, path)
        location = _field(value, "location", str, path)
        partitions: dict[int, ArchivedPartition] = {}
        for key, raw in _field(value, "partitions", dict, path).items():
            if not key.isdigit() or not isinstance(raw, dict):
                raise MetadataError(f"znode {path}: partition {key!r} is {raw!r}")
            partitions[int(key)] = ArchivedPartition(
                _field(raw, "archived_through", int, path),
                _field(raw, "chunks", int, path),
                _field(raw, "bytes", int, path),
            )
        return cls(location, partitions)
