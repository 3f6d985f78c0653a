"""The znode paths of one cluster under its root (docs/zookeeper.md, the layout)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Self

from waltz.errors import MetadataError

__all__ = ["ClusterPaths"]


@dataclass(frozen=True, slots=True)
class ClusterPaths:
    """The znode paths of one cluster."""

    root: str

    @classmethod
    def of(cls, root: str) -> Self:
        """Normalise a cluster root (absolute, no trailing slash).

        Raises:
            MetadataError: the root is not an absolute path, or is ``/``.
        """
        normalised = "/" + root.strip("/")
        if not root.startswith("/"):
            raise MetadataError(
                f"cluster root {root!r} must be an absolute znode path such as /waltz/cluster1"
            )
        if normalised == "/":
            raise MetadataError(
                f"cluster root {root!r} is ZooKeeper's own root, which every other user of the "
                "ensemble shares: give a znode below it, such as /waltz/cluster1"
            )
        return cls(normalised)

    @property
    def parents(self) -> tuple[str, ...]:
        """The znodes above the root, ``/`` left out, the highest first (``/waltz`` for
        ``/waltz/cluster1``)."""
        parts = self.root.strip("/").split("/")[:-1]
        return tuple("/" + "/".join(parts[: i + 1]) for i in range(len(parts)))

    @property
    def cluster(self) -> str:
        return f"{self.root}/cluster"

    @property
    def discovery(self) -> str:
        """The name and number of partitions, readable by clients (no cluster key)."""
        return f"{self.root}/discovery"

    @property
    def roles(self) -> str:
        """The digest identity of each role (absent in a cluster made with a single credential)."""
        return f"{self.root}/roles"

    def relative(self, path: str) -> str:
        """A znode's path below the root without the leading slash (``""`` for the root)."""
        return path.removeprefix(self.root).lstrip("/")

    @property
    def store(self) -> str:
        return f"{self.root}/store"

    @property
    def assignment(self) -> str:
        return f"{self.root}/store/assignment"

    @property
    def group(self) -> str:
        return f"{self.root}/store/group"

    @property
    def connection(self) -> str:
        return f"{self.root}/store/connection"

    @property
    def partitions(self) -> str:
        return f"{self.root}/store/partition"

    def partition(self, partition_id: int) -> str:
        return f"{self.root}/store/partition/{partition_id}"

    @property
    def server(self) -> str:
        return f"{self.root}/server"

    @property
    def members(self) -> str:
        """Parent of the servers' ephemeral sequential member znodes."""
        return f"{self.root}/server/members"

    @property
    def election(self) -> str:
        """The cluster manager's election znode."""
        return f"{self.root}/server/election"

    @property
    def server_assignment(self) -> str:
        """The partition assignment written by the cluster manager."""
        return f"{self.root}/server/assignment"

    @property
    def server_preferred(self) -> str:
        """The run-time preferred partitions, written by operators (``waltz server preferred``)."""
        return f"{self.root}/server/preferred"

    @property
    def client(self) -> str:
        """Parent of the client ID counter."""
        return f"{self.root}/client"

    @property
    def client_id(self) -> str:
        """The client ID counter (a kazoo ``Counter``)."""
        return f"{self.root}/client/id"

    @property
    def client_ids(self) -> str:
        """Where clients of a cluster made with role credentials take their IDs: one sequential
        znode each; its data is the last ID the ``client/id`` counter handed out before it."""
        return f"{self.root}/client/ids"

    @property
    def partitions_parent(self) -> str:
        """``<root>/partitions``, the parent of :attr:`epochs` (empty; not :attr:`partitions`,
        which is ``store/partition``)."""
        return f"{self.root}/partitions"

    @property
    def epochs(self) -> str:
        """The partition epochs of the cluster's splits (absent until the first split starts;
        docs/design/splits.md "What ZooKeeper holds")."""
        return f"{self.root}/partitions/epochs"

    @property
    def archive(self) -> str:
        """The archive's summary, written by the archiver (absent until its first run)."""
        return f"{self.root}/archive"
