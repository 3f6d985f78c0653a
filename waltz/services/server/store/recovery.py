"""The recovery of a new store session (docs/design/recovery.md, from "When a recovery runs").

Run whenever a store session starts, before it writes anything:

1. Every reachable replica is cleaned by what ZooKeeper and the replica itself say about it:
   a replica that is not in the last session's replica set (new), or whose last session on disk is
   older than its replica state (restored from an old backup, docs/design/recovery.md "Cleaning
   each replica"), is truncated to its own low-water mark and casts no vote: a restored replica may
   have acknowledged more than it holds, so it counts as a voter that is down. A replica whose
   closing high-water mark is known is truncated to it; any other replica of the last session
   keeps its records, which are a prefix of what the last session wrote, and votes with its max
   transaction ID.
2. The replicas of the last session vote (:func:`voting.resolve_high_water_mark`). While the
   result is undecidable, replicas behind the highest one are caught up from it (copying the
   last session's records, which may decide the vote), and replicas that were down are tried again.
   A restored replica votes only once it holds the highest reachable replica's records and the
   replicas that vote with their own records are in every quorum of the last session
   (docs/design/recovery.md "Replicas restored from an old copy").
3. Every reachable replica above the resolved high-water mark is truncated to it, and its
   low-water mark is set. Replicas at the mark are the clean replicas that the new session writes
   to; if fewer than a quorum are, the most advanced replicas below it are caught up first. The
   other replicas below it are lagging: the session catches them up in the background
   (:mod:`~waltz.services.server.store.catch_up`) while it writes.
4. The partition metadata is updated by compare-and-set: clean and lagging replicas join the new
   session; replicas of the last session that were not reached get the closing high-water mark.

The log never forks: records above the resolved high-water mark are removed from every replica
before the session writes, and a replica that missed the recovery is truncated to the closing
high-water mark before it may vote again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from waltz.errors import StaleMetadataError, WaltzError
from waltz.metadata.replicas import quorum_of
from waltz.metadata.values import PartitionMetadata, ReplicaState
from waltz.metadata.zk import ClusterZk, Versioned
from waltz.services.server.store.config import StoreConfig
from waltz.services.server.store.replica import ReplicaConnection, ReplicaError
from waltz.services.server.store.voting import resolve_high_water_mark

__all__ = [
    "CleanedReplica",
    "LaggingReplica",
    "RecoveryAbortedError",
    "RecoveryManager",
    "RecoveryResult",
    "clean_replica",
]

log = logging.getLogger(__name__)


class RecoveryAbortedError(WaltzError):
    """The recovery was stopped (the partition closed, or another session took over)."""


@dataclass(slots=True)
class _Replica:
    connection: ReplicaConnection
    high_water_mark: int
    # A replica of the last set that votes (restored ones only once admitted, _admit_restored).
    votes: bool
    # A replica of the last set restored from an old copy (docs/design/recovery.md "Replicas
    # restored from an old copy").
    restored: bool = False
    clean: bool = False
    lagging: bool = False


@dataclass(frozen=True, slots=True)
class CleanedReplica:
    """One replica after cleaning (docs/design/recovery.md "Cleaning each replica").

    Attributes:
        high_water_mark: its highest transaction ID after cleaning.
        restored: True when its last session on disk is older than its replica state says
            (restored from an old copy): it may have acknowledged transactions it no longer
            holds, so its maximum is no vote (docs/design/recovery.md "Replicas restored from an
            old copy").
    """

    high_water_mark: int
    restored: bool = False


@dataclass(frozen=True, slots=True)
class LaggingReplica:
    """A replica that joined a session below its starting high-water mark.

    Attributes:
        connection: its replica connection, open under the session's ID.
        high_water_mark: its highest transaction ID (every record up to it is committed).
    """

    connection: ReplicaConnection
    high_water_mark: int


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    """The outcome of a recovery.

    Attributes:
        high_water_mark: the resolved high-water mark: every transaction up to it is committed,
            none above it exists on any clean replica.
        clean: the replica connections the new session writes to (all at the high-water mark).
        metadata: the partition metadata written at the end, with its version.
        lagging: replicas of the new session below the high-water mark, which the session catches
            up in the background (docs/design/recovery.md "Catching up in the background").
    """

    high_water_mark: int
    clean: dict[str, ReplicaConnection]
    metadata: Versioned[PartitionMetadata]
    lagging: dict[str, LaggingReplica] = field(default_factory=dict)


async def clean_replica(
    partition_id: int, storage: str, connection: ReplicaConnection, state: ReplicaState | None
) -> CleanedReplica:
    """Clean one replica by the rules of docs/design/recovery.md "Cleaning each replica".

    Args:
        partition_id: the partition.
        storage: the replica's storage node.
        connection: its replica connection, open under the new session's ID.
        state: its replica state in the partition metadata (None: new to the partition).

    Returns:
        The replica's highest transaction ID after cleaning, and whether it was restored from an
        old copy (its maximum is then no vote).

    Raises:
        ReplicaError: the replica failed a request.
    """
    last_session, low_water_mark = await connection.last_session_info()
    if state is None:
        log.info(
            "partition %d: new replica on %s: truncating to its low-water mark %d",
            partition_id,
            storage,
            low_water_mark,
        )
        return CleanedReplica(await connection.truncate(low_water_mark))
    if last_session < state.session_id:
        log.warning(
            "partition %d: replica on %s was last in session %d but ZooKeeper says %d (restored from "
            "a backup?): truncating to its low-water mark %d and catching it up; it casts no vote, "
            "since it may have acknowledged transactions it no longer holds",
            partition_id,
            storage,
            last_session,
            state.session_id,
            low_water_mark,
        )
        return CleanedReplica(await connection.truncate(low_water_mark), restored=True)
    closing = state.closing_high_water_mark
    if closing is not None:
        if low_water_mark > closing:
            # A recovery cleaned it past its recorded mark and stopped before recording so: every
            # record up to its own low-water mark is committed, and the floor keeps them.
            log.info(
                "partition %d: replica on %s has low-water mark %d above its closing high-water mark %d "
                "(a recovery that cleaned it did not record so): truncating to its low-water mark",
                partition_id,
                storage,
                low_water_mark,
                closing,
            )
        return CleanedReplica(await connection.truncate(max(closing, low_water_mark)))
    return CleanedReplica(await connection.max_transaction_id())


class RecoveryManager:
    """Runs the recovery of one new store session.

    Args:
        partition_id: the partition.
        session: the partition metadata just written for the new session (its session ID and
            generation) and its znode version.
        previous: the partition metadata before the new session (the last session's replicas).
        assigned: connect strings of the storage nodes assigned a replica of the partition.
        connect: opens a replica connection under the new session ID (raises ReplicaError).
        zk: the cluster's znodes.
        config: store settings.
        closed: returns True when the partition is closing (the recovery then aborts).
    """

    def __init__(
        self,
        partition_id: int,
        session: Versioned[PartitionMetadata],
        previous: PartitionMetadata,
        assigned: Sequence[str],
        connect: Callable[[str], ReplicaConnection],
        zk: ClusterZk,
        config: StoreConfig,
        closed: Callable[[], bool] = lambda: False,
    ) -> None:
        self.partition_id = partition_id
        self.session = session
        self.previous = previous
        self.assigned = sorted(set(assigned))
        self._connect = connect
        self._zk = zk
        self._config = config
        self._closed = closed
        self._replicas: dict[str, _Replica] = {}
        self._fresh = not previous.replicas
        # The replica set of the last session; a fresh partition votes among its assigned replicas.
        self._last_set = set(self.assigned) if self._fresh else set(previous.replicas)

    @property
    def session_id(self) -> int:
        """The new store session ID."""
        return self.session.value.session_id

    async def run(self) -> RecoveryResult:
        """Recover; returns once the high-water mark is resolved and a write quorum is clean.

        Raises:
            RecoveryAbortedError: the partition closed, or another session took over the partition.
        """
        write_quorum = quorum_of(len(self.assigned))
        high_water_mark: int | None = None
        attempt = 0
        try:
            while True:
                self._check_open()
                await self._reach_missing()
                if high_water_mark is None:
                    high_water_mark = await self._resolve()
                if high_water_mark is not None:
                    await self._clean_to(high_water_mark, write_quorum)
                    if sum(r.clean for r in self._replicas.values()) >= write_quorum:
                        break
                attempt += 1
                if attempt == 1 or attempt % 20 == 0:
                    log.warning(
                        "partition %d: session %d waits for storage nodes: %d of %d assigned replicas "
                        "reachable, high-water mark %s%s",
                        self.partition_id,
                        self.session_id,
                        len(self._replicas),
                        len(self.assigned),
                        "undecidable" if high_water_mark is None else high_water_mark,
                        self._restored_note() if high_water_mark is None else "",
                    )
                await asyncio.sleep(self._config.retry_interval)
            metadata = await asyncio.to_thread(self._update_metadata, high_water_mark)
        except BaseException:
            await self._close_all()
            raise
        clean = {s: r.connection for s, r in self._replicas.items() if r.clean}
        lagging = {
            s: LaggingReplica(r.connection, r.high_water_mark) for s, r in self._replicas.items() if r.lagging
        }
        log.info(
            "partition %d: session %d recovered: high-water mark %d, clean replicas %s%s",
            self.partition_id,
            self.session_id,
            high_water_mark,
            ", ".join(sorted(clean)),
            "".join(f", {s} lagging at {r.high_water_mark}" for s, r in sorted(lagging.items())),
        )
        return RecoveryResult(high_water_mark, clean, metadata, lagging)

    def _check_open(self) -> None:
        if self._closed():
            raise RecoveryAbortedError(
                f"partition {self.partition_id}: closed during the recovery of session {self.session_id}"
            )

    async def _close_all(self) -> None:
        for replica in self._replicas.values():
            await replica.connection.close()
        self._replicas.clear()

    # ---- step 1: reach and clean each replica ----

    async def _reach_missing(self) -> None:
        missing = [s for s in self.assigned if s not in self._replicas]
        if missing:
            await asyncio.gather(*(self._reach(storage) for storage in missing))

    async def _reach(self, storage: str) -> None:
        connection = self._connect(storage)
        try:
            await connection.open()
            cleaned = await self._clean_replica(storage, connection)
        except ReplicaError as exc:
            await connection.close()
            if exc.code == "SESSION_FENCED":
                raise RecoveryAbortedError(
                    f"partition {self.partition_id}: session {self.session_id} was fenced: {exc}"
                ) from exc
            # A replica of another cluster (wrong cluster key), one whose fence is too far below
            # this session to raise, or one whose partition info is corrupt needs an operator,
            # not a node that is down for a while: say it loudly.
            loud = exc.code in ("CLUSTER_KEY_MISMATCH", "SESSION_JUMP_TOO_LARGE", "CORRUPT_DATA")
            level = logging.WARNING if loud else logging.INFO
            log.log(level, "partition %d: replica on %s unavailable: %s", self.partition_id, storage, exc)
            return
        in_last_set = storage in self._last_set
        self._replicas[storage] = _Replica(
            connection,
            cleaned.high_water_mark,
            votes=in_last_set and not cleaned.restored,
            restored=in_last_set and cleaned.restored,
        )

    async def _clean_replica(self, storage: str, connection: ReplicaConnection) -> CleanedReplica:
        """Apply step 1 to one replica and return its high-water mark."""
        state = ReplicaState(-1, None) if self._fresh else self.previous.replicas.get(storage)
        return await clean_replica(self.partition_id, storage, connection, state)

    # ---- step 2: vote ----

    async def _resolve(self) -> int | None:
        while True:
            self._admit_restored()
            voters = [r for r in self._replicas.values() if r.votes]
            # Unreachable voters, and restored replicas not admitted yet, vote for nothing.
            offline = len(self._last_set) - len(voters)
            resolved = resolve_high_water_mark(
                [r.high_water_mark for r in voters], offline, quorum_of(len(self._last_set))
            )
            if resolved is not None:
                return resolved
            # Undecidable: catching replicas up with the highest one can decide it.
            if not await self._catch_up_with_usher():
                return None

    def _admit_restored(self) -> None:
        """Let restored replicas vote once their vote is sound (docs/design/recovery.md "Replicas
        restored from an old copy").

        A voter is sound when its maximum is at least every committed record it acknowledged;
        every other voter of the last set counts as down. A committed record is on a quorum of
        the last set, so when the sound voters reached are in every quorum (more than the last
        set's size minus the quorum), one of them holds it, and the highest reachable replica's
        maximum is at least every committed record. A restored replica that holds that maximum
        then votes with it: its vote is at least everything it acknowledged before its restore.
        """
        restored = [r for r in self._replicas.values() if r.restored and not r.votes]
        if not restored:
            return
        sound = sum(r.votes for r in self._replicas.values())
        if len(self._last_set) - sound >= quorum_of(len(self._last_set)):
            return  # a quorum may have acknowledged records that no sound voter reached holds
        top = max(r.high_water_mark for r in self._replicas.values())
        for replica in restored:
            if replica.high_water_mark == top:
                replica.votes = True

    def _restored_note(self) -> str:
        """What the wait's warning adds when restored replicas cast no vote."""
        restored = sorted(s for s, r in self._replicas.items() if r.restored and not r.votes)
        if not restored:
            return ""
        citation = 'docs/design/recovery.md, "Replicas restored from an old copy"'
        return (
            f"; {', '.join(restored)} restored from an old copy and cast no vote: they and the voters "
            f"not reached are a quorum of the last session's {len(self._last_set)} replicas, so "
            "transactions acknowledged before the restore may be on no replica reached; the recovery "
            f"waits for a replica of the last session that holds its own records ({citation})"
        )

    async def _catch_up_with_usher(self) -> bool:
        if len(self._replicas) < 2:
            return False
        usher = max(self._replicas.values(), key=lambda r: r.high_water_mark)
        behind = [r for r in self._replicas.values() if r.high_water_mark < usher.high_water_mark]
        if not behind:
            return False
        for replica in behind:
            await self._copy(usher, replica, usher.high_water_mark)
        return True

    async def _copy(self, source: _Replica, target: _Replica, last: int) -> None:
        try:
            target.high_water_mark = await target.connection.copy_from(
                source.connection, target.high_water_mark + 1, last, self._config.catch_up_page
            )
        except ReplicaError as exc:
            failed = source if exc.storage == source.connection.storage else target
            log.warning(
                "partition %d: catch-up failed, %s leaves: %s",
                self.partition_id,
                failed.connection.storage,
                exc,
            )
            self._replicas.pop(failed.connection.storage, None)
            await failed.connection.close()

    # ---- step 3: bring every reachable replica to the high-water mark ----

    async def _clean_to(self, high_water_mark: int, write_quorum: int) -> None:
        """Make replicas clean at ``high_water_mark``: those above or at it first, then, while
        fewer than ``write_quorum`` are clean, the most advanced of those below it (copying what
        they lack). Once a quorum is clean, the others below it are lagging: the session catches
        them up while it writes (docs/design/recovery.md "Catching up in the background")."""
        pending = [(s, r) for s, r in self._replicas.items() if not r.clean and not r.lagging]
        pending.sort(key=lambda item: item[1].high_water_mark, reverse=True)
        for storage, replica in pending:
            if storage not in self._replicas:
                continue
            try:
                if replica.high_water_mark > high_water_mark:
                    replica.high_water_mark = await replica.connection.truncate(high_water_mark)
                if replica.high_water_mark < high_water_mark:
                    if sum(r.clean for r in self._replicas.values()) >= write_quorum:
                        # Its records are committed ones; the session copies the rest.
                        await replica.connection.set_low_water_mark(high_water_mark)
                        replica.lagging = True
                        continue
                    sources = [r for r in self._replicas.values() if r.high_water_mark >= high_water_mark]
                    if not sources:
                        raise ReplicaError(
                            storage, self.partition_id, "MISSING", "no replica holds the high-water mark"
                        )
                    await self._copy(sources[0], replica, high_water_mark)
                    if storage not in self._replicas:
                        continue
                if replica.high_water_mark != high_water_mark:
                    raise ReplicaError(
                        storage,
                        self.partition_id,
                        "MISMATCH",
                        f"replica at {replica.high_water_mark} after cleaning to {high_water_mark}",
                    )
                await replica.connection.set_low_water_mark(high_water_mark)
                replica.clean = True
            except ReplicaError as exc:
                log.warning(
                    "partition %d: replica on %s leaves the recovery: %s", self.partition_id, storage, exc
                )
                self._replicas.pop(storage, None)
                await replica.connection.close()

    # ---- step 4: metadata ----

    def _update_metadata(self, high_water_mark: int) -> Versioned[PartitionMetadata]:
        current = self.session
        for _ in range(50):
            if current.value.session_id != self.session_id:
                raise RecoveryAbortedError(
                    f"partition {self.partition_id}: session {current.value.session_id} replaced session "
                    f"{self.session_id} during its recovery"
                )
            replicas: dict[str, ReplicaState] = {}
            for storage in sorted(set(self.assigned) | self._last_set):
                state = current.value.replicas.get(storage)
                if storage in self._replicas:
                    replicas[storage] = ReplicaState(self.session_id, None)
                elif state is None or storage not in self.assigned:
                    continue  # never part of a session, or removed from the assignment
                elif state.closing_high_water_mark is None and state.session_id < self.session_id:
                    replicas[storage] = ReplicaState(state.session_id, high_water_mark)
                else:
                    replicas[storage] = state
            new = current.value.evolve(replicas=replicas)
            try:
                version = self._zk.set_partition_metadata(self.partition_id, new, current.version)
                return Versioned(new, version)
            except StaleMetadataError:
                current = self._zk.partition_metadata(self.partition_id)
        raise RecoveryAbortedError(f"partition {self.partition_id}: could not update its metadata")
