"""The operator actions of the console: replica add and remove, partition recovery.

Design: docs/design/console.md "Operator actions". Each action is the ``waltz cluster storage``
command of the same name, run through the same admin function
(:meth:`~waltz.admin.storage_admin.StorageNodeAdmin.assign`,
:meth:`~waltz.admin.storage_admin.StorageNodeAdmin.unassign`,
:func:`~waltz.admin.recover.recover_partition`), so the same safety rules refuse the same
changes. An action runs in two steps: the page asks for it and gets a confirmation that says what
will happen, with a single-use token; only posting that token runs it. The token also keeps
another site from making the browser post an action: it never sees the confirmation.
"""

from __future__ import annotations

import enum
import re
import secrets
import time
from collections.abc import Collection
from dataclasses import dataclass

from waltz.admin.cluster_admin import ClusterAdmin
from waltz.admin.recover import recover_partition
from waltz.errors import ConfigurationError, WaltzError
from waltz.protocol.event_loop import run_on_shared_loop

__all__ = ["Action", "ActionFailedError", "ActionKind", "Confirmations", "run_action"]

#: Seconds a confirmation stays valid.
CONFIRMATION_TTL = 300.0
#: Confirmations kept at most (the oldest go first).
MAX_CONFIRMATIONS = 64
#: A storage node's connect string: ``host:port``, the host a name, an IPv4 address or a
#: bracketed IPv6 address (ASCII only: nothing that could start a new line of the audit log).
STORAGE_ADDRESS = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9._-]{0,252})|\[[0-9A-Fa-f:.]{2,45}\]):[0-9]{1,5}")


class ActionFailedError(WaltzError):
    """An action was run and did not do all it should: a storage node refused or did not answer
    after ZooKeeper was changed (docs/design/console.md "Operator actions")."""


def _storage_address(value: str, what: str) -> str:
    """``value`` stripped, when it is a ``host:port`` connect string.

    Raises:
        ConfigurationError: it is not.
    """
    address = value.strip()
    found = STORAGE_ADDRESS.fullmatch(address)
    if found is None or int(address.rsplit(":", 1)[1]) > 65535:
        raise ConfigurationError(
            f"{what} {address[:100]!r} is not a storage node's host:port: choose one of the map's "
            "storage nodes"
        )
    return address


class ActionKind(enum.Enum):
    """What an operator action does."""

    ADD_REPLICA = "add-replica"
    REMOVE_REPLICA = "remove-replica"
    RECOVER_PARTITION = "recover-partition"


@dataclass(frozen=True, slots=True)
class Action:
    """One operator action.

    Attributes:
        kind: what it does.
        partition_id: the partition.
        storage: the storage node (connect string) that gains or loses the replica, or the
            destination of a recovery.
        source: the storage node a recovery copies from (recoveries only).
    """

    kind: ActionKind
    partition_id: int
    storage: str
    source: str | None = None

    @classmethod
    def parse(cls, kind: str, partition: str, storage: str, source: str | None) -> Action:
        """Build an action from the page's form fields.

        Args:
            kind: an :class:`ActionKind` value.
            partition: the partition ID, ASCII digits.
            storage: the storage node's ``host:port``.
            source: a recovery's source storage node's ``host:port`` (ignored by the others).

        Raises:
            ConfigurationError: a field is missing or malformed (a partition that is not ASCII
                digits, a storage node that is not ``host:port``).
        """
        try:
            action_kind = ActionKind(kind)
        except ValueError:
            raise ConfigurationError(f"unknown action {kind[:100]!r}") from None
        digits = partition.strip()
        if not (digits.isascii() and digits.isdecimal()):
            raise ConfigurationError(
                f"partition {partition[:100]!r} is not a partition ID: give its number in digits 0-9"
            )
        if not storage.strip():
            raise ConfigurationError("choose a storage node")
        destination = _storage_address(storage, "storage node")
        origin = None
        if action_kind is ActionKind.RECOVER_PARTITION:
            if not source or not source.strip():
                raise ConfigurationError("a recovery needs a source storage node")
            origin = _storage_address(source, "source storage node")
            if origin == destination:
                raise ConfigurationError("the source and the destination are the same storage node")
        return cls(action_kind, int(digits), destination, origin)

    def check_storage_nodes(self, known: Collection[str]) -> None:
        """Check that the action's storage nodes are the cluster's.

        Args:
            known: the connect strings of the cluster's storage nodes (the last cluster map's).

        Raises:
            ConfigurationError: a storage node of the action is not one of ``known``.
        """
        for node in (self.storage, self.source):
            if node is not None and node not in known:
                raise ConfigurationError(
                    f"{node} is not a storage node of the cluster: choose one of the map's storage "
                    f"nodes ({', '.join(sorted(known)) or 'none'})"
                )

    def check_partition(self, known: Collection[int]) -> None:
        """Check that the action's partition is the cluster's (docs/design/console.md "Operator
        actions").

        Args:
            known: the cluster's partition IDs (the last cluster map's).

        Raises:
            ConfigurationError: the partition is not one of ``known``.
        """
        if self.partition_id in known:
            return
        ids = sorted(known)
        if not ids:
            shown = "none"
        elif ids == list(range(ids[0], ids[-1] + 1)):
            shown = f"{ids[0]}..{ids[-1]}"
        else:
            shown = ", ".join(map(str, ids))
        raise ConfigurationError(
            f"partition {self.partition_id} is not a partition of the cluster: choose one of the "
            f"map's partitions ({shown})"
        )

    def describe(self) -> str:
        """What the action will do, in one sentence."""
        if self.kind is ActionKind.ADD_REPLICA:
            return (
                f"Assign a replica of partition {self.partition_id} to storage node {self.storage}: "
                "the partition is created on the node, then recorded in ZooKeeper; the next store "
                "session catches it up."
            )
        if self.kind is ActionKind.REMOVE_REPLICA:
            return (
                f"Unassign the replica of partition {self.partition_id} from storage node "
                f"{self.storage}: removed from ZooKeeper, then from the node (its files are kept)."
            )
        return (
            f"Copy partition {self.partition_id} from {self.source} to {self.storage} up to what "
            f"is known committed; {self.storage} is first truncated to its own low-water mark."
        )

    def command(self) -> str:
        """The ``waltz cluster storage`` command that does the same."""
        if self.kind is ActionKind.ADD_REPLICA:
            return f"waltz cluster storage assign {self.storage} --partition {self.partition_id}"
        if self.kind is ActionKind.REMOVE_REPLICA:
            return f"waltz cluster storage unassign {self.storage} --partition {self.partition_id}"
        return (
            f"waltz cluster storage recover-partition --source {self.source} "
            f"--destination {self.storage} --partition {self.partition_id}"
        )


def run_action(admin: ClusterAdmin, action: Action) -> str:
    """Run an action (blocking: call it from a worker thread) and say what it did.

    Returns:
        What it did, in one sentence.

    Raises:
        ReplicaChangeRefusedError: a safety rule refused the change (nothing changed).
        AdminRoleRequiredError: the console's certificate lacks the admin role a replica change
            needs (nothing changed).
        ActionFailedError: a removal changed ZooKeeper but the storage node refused it or did not
            answer (it still holds the partition): the action did not do all it should.
        WaltzError: ZooKeeper or a storage node failed, or the arguments are wrong.
        ConnectionError, TimeoutError: a storage node did not answer a recovery.
    """
    pid = action.partition_id
    if action.kind is ActionKind.ADD_REPLICA:
        result = admin.storage.assign(action.storage, [pid])
        done = "assigned" if result.changed else "was already assigned"
        return f"storage {action.storage} {done} a replica of partition {pid}"
    if action.kind is ActionKind.REMOVE_REPLICA:
        result = admin.storage.unassign(action.storage, [pid])
        done = "no longer holds" if result.changed else "did not hold"
        message = f"storage {action.storage} {done} a replica of partition {pid}"
        if result.storage_error is None:
            return message
        zookeeper = f"in ZooKeeper, {message}" if result.changed else f"ZooKeeper says {message}"
        if result.storage_refused:
            raise ActionFailedError(
                f"{zookeeper}, but the node refused to drop the partition ({result.storage_error}) "
                "and still holds it: fix what the node says (the console's certificate, "
                "cluster.ssl.certFile, needs the admin role to change a node), then run the action again"
            )
        raise ActionFailedError(
            f"{zookeeper}, but the node could not be reached ({result.storage_error}) and still "
            "holds the partition: run the action again when the node is back"
        )
    assert action.source is not None
    recovered = run_on_shared_loop(
        recover_partition(
            admin.cluster, action.source, action.storage, pid, timeout=admin.storage_timeout, tls=admin.tls
        )
    )
    return (
        f"partition {pid}: {action.storage} kept 0..{recovered.kept}, copied {recovered.copied} "
        f"record(s) from {action.source} up to the committed transaction {recovered.committed}"
    )


class Confirmations:
    """Single-use tokens of actions awaiting the operator's confirmation.

    Args:
        ttl: seconds a token stays valid.
    """

    def __init__(self, ttl: float = CONFIRMATION_TTL) -> None:
        self._ttl = ttl
        self._pending: dict[str, tuple[Action, str, float]] = {}

    def issue(self, action: Action, requester: str = "") -> str:
        """A new token for ``action`` asked for by ``requester`` (an unguessable URL-safe string).

        Args:
            action: the action to confirm.
            requester: who asked (:attr:`~waltz.console.access.Requester.identity`): only the
                same requester can take the token.
        """
        now = time.monotonic()
        self._pending = {t: p for t, p in self._pending.items() if now - p[2] < self._ttl}
        while len(self._pending) >= MAX_CONFIRMATIONS:
            del self._pending[next(iter(self._pending))]
        token = secrets.token_urlsafe(24)
        self._pending[token] = (action, requester, now)
        return token

    def lookup(self, token: str) -> Action | None:
        """The action of ``token`` without using it up; None when unknown, used or expired."""
        found = self._pending.get(token)
        if found is None or time.monotonic() - found[2] >= self._ttl:
            return None
        return found[0]

    def take(self, token: str, requester: str = "") -> Action | None:
        """The action of ``token``, which is used up; None when unknown, used, expired or asked
        for by another requester (the token is used up all the same)."""
        found = self._pending.pop(token, None)
        if found is None or found[1] != requester or time.monotonic() - found[2] >= self._ttl:
            return None
        return found[0]
