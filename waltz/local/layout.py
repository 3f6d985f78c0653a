"""The layout file of a kept local cluster (``cluster.json`` in its work directory).

It records what a later start of the same work directory needs to start the same cluster again:
its name, root, partitions and replicas, and every node's ports.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from waltz.errors import ConfigurationError
from waltz.private_files import write_private

__all__ = ["LAYOUT_FILE", "LAYOUT_VERSION", "ClusterLayout"]

#: The layout's file name in the work directory.
LAYOUT_FILE = "cluster.json"
#: The format version written into the file; another version is refused.
LAYOUT_VERSION = 1


@dataclass(frozen=True, slots=True)
class ClusterLayout:
    """What ``cluster.json`` keeps of a local cluster in a kept work directory.

    Attributes:
        name: the cluster's name.
        root: the cluster root znode.
        partitions: the number of partitions.
        replicas: replicas per partition.
        external_zookeeper: the connect string of a ZooKeeper the cluster did not start, or None.
        zookeeper_port: the port of the cluster's own ZooKeeper, or None.
        storages: each storage node's ``port``, ``admin_port`` and ``metrics_port``.
        servers: each server's ``port`` and ``metrics_port``.
        network: ``loopback`` or ``namespaces`` (absent from older files: loopback).
        subnet: the hosts' network in namespace mode (their addresses are in ZooKeeper).
    """

    name: str
    root: str
    partitions: int
    replicas: int
    external_zookeeper: str | None
    zookeeper_port: int | None
    storages: list[dict[str, int | None]]  # port, admin_port, metrics_port
    servers: list[dict[str, int | None]]  # port, metrics_port
    network: str = "loopback"
    subnet: str | None = None

    def differences(
        self,
        *,
        name: str,
        root: str,
        partitions: int,
        replicas: int,
        storages: int,
        external_zookeeper: str | None,
        network: str,
    ) -> list[str]:
        """What differs between this kept cluster and the one a start asks for, for a message.

        The ports, which a start takes from the kept layout, and the subnet, which namespace mode
        checks itself, are not compared.

        Returns:
            One ``<what> <kept value> (asked: <value>)`` per difference; empty when they agree.
        """
        pairs: dict[str, tuple[object, object]] = {
            "name": (self.name, name),
            "root": (self.root, root),
            "partitions": (self.partitions, partitions),
            "replicas": (self.replicas, replicas),
            "storages": (len(self.storages), storages),
            "external ZooKeeper": (self.external_zookeeper, external_zookeeper),
            "network": (self.network, network),
        }
        return [
            f"{what} {held!r} (asked: {asked!r})" for what, (held, asked) in pairs.items() if held != asked
        ]

    def save(self, path: Path) -> None:
        """Write the layout to ``path`` (JSON)."""
        write_private(path, json.dumps({"format_version": LAYOUT_VERSION, **asdict(self)}, indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> ClusterLayout:
        """Read a layout written by :meth:`save`.

        Raises:
            ConfigurationError: the file cannot be read, or is of another format version.
        """
        try:
            raw = json.loads(path.read_text())
            if raw.pop("format_version", None) != LAYOUT_VERSION:
                raise ValueError(f"format_version is not {LAYOUT_VERSION}")
            return cls(**raw)
        except (OSError, ValueError, TypeError) as exc:
            raise ConfigurationError(
                f"cannot read the local cluster layout {path}: {exc}; "
                "use another work directory, or delete this one to start afresh"
            ) from exc
