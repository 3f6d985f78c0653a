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
import secrets
import time
from dataclasses import dataclass

from waltz.admin.cluster_admin import ClusterAdmin
from waltz.admin.recover import recover_partition
from waltz.errors import ConfigurationError
from waltz.protocol.event_loop import run_on_shared_loop

__all__ = ["Action", "ActionKind", "Confirmations", "run_action"]

#: Seconds a confirmation stays valid.
CONFIRMATION_TTL = 300.0
#: Confirmations kept at most (the oldest go first).
MAX_CONFIRMATIONS = 64


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

        Raises:
            ConfigurationError: a field is missing or malformed.
        """
        try:
            action_kind = ActionKind(kind)
        except ValueError:
            raise ConfigurationError(f"unknown action {kind!r}") from None
        if not partition.strip().isdigit():
            raise ConfigurationError(f"partition {partition!r} is not a partition ID")
        if not storage.strip():
            raise ConfigurationError("choose a storage node")
        if action_kind is ActionKind.RECOVER_PARTITION:
            if not source or not source.strip():
                raise ConfigurationError("a recovery needs a source storage node")
            if source.strip() == storage.strip():
                raise ConfigurationError("the source and the destination are the same storage node")
        else:
            source = None
        return cls(action_kind, int(partition), storage.strip(), source.strip() if source else None)

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

    Raises:
        ReplicaChangeRefusedError: a safety rule refused the change.
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
        if result.storage_error is not None:
            message += (
                f"; ZooKeeper is updated but the node still holds the files ({result.storage_error}): "
                "run the action again when the node is back"
            )
        return message
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

    def take(self, token: str, requester: str = "") -> Action | None:
        """The action of ``token``, which is used up; None when unknown, used, expired or asked
        for by another requester (the token is used up all the same)."""
        found = self._pending.pop(token, None)
        if found is None or found[1] != requester or time.monotonic() - found[2] >= self._ttl:
            return None
        return found[0]
