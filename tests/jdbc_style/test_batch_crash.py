"""Exactly once per member when an instance dies between a batch's commit and its apply.

An instance (``batch_instance.py``, a process of its own) commits a batch of keyed increments of
one hot counter through an :class:`~waltz.jdbc_style.entity_batches.EntityBatcher`, reports each
member's key and transaction ID, and dies with SIGKILL: before its apply of the batch (the
partition's applies held), or inside it, after members 0 and 1 wrote and before the database
transaction commits. A second instance (a client in this test, on the same database) then
catches up: the counter rises by exactly the number of members, each key is recorded once,
against the batch's transaction, and each request sent again is answered as already applied with
that transaction's ID, appending nothing; copies sent without the attempt's key check commit,
one by one, and their apply changes nothing (docs/design/sql.md ("Batched entity transactions"),
docs/design/sql.md ("Batched change-sets"), docs/design/sql.md ("Idempotency keys")).

Each test runs on SQLite, PostgreSQL and MariaDB (``app_db_url``), with the second instance's
entity cache on and off (its attempts read the keys from the cache's snapshot or the database).

The session's log is shared with other tests; each database is fresh (marks at -1) and applies
their transactions too, passing over what is not this module's (``BatchCrashCallbacks``).
"""

from __future__ import annotations

import json
import os
import random
import re
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
import support

from tests.jdbc_style.batch_instance import (
    FAILPOINT_PATTERN,
    Base,
    BatchCrashCallbacks,
    Gate,
    HotCounter,
    KeyedIncrement,
    submit_behind_gate,
)
from waltz import OutcomeKind, WaltzClient, WaltzClientConfig
from waltz.jdbc_style import AppliedRequest, create_framework_engine
from waltz.jdbc_style.entity_batches import EntityBatcher
from waltz.jdbc_style.schema import idempotency_keys
from waltz.local.cluster import LocalCluster
from waltz.local.processes import ManagedProcess, wait_until

INSTANCE_SCRIPT = Path(__file__).with_name("batch_instance.py")
#: Keyed increments the killed instance commits (one batch: below the batcher's 64 members).
MEMBERS = 20
#: Seconds any one wait of a test lasts at most.
TIMEOUT = 60.0


@dataclass
class Crash:
    """What one test shares: the cluster, the database and where the instance's files go."""

    process_factory: support.ProcessFactory
    cluster: LocalCluster
    db_url: str
    cluster_name: str
    work_dir: Path
    second_cache: bool
    """Whether the second instance keeps the entity cache (its attempts' key reads differ)."""


@pytest.fixture(params=[True, False], ids=["entity-cache", "no-entity-cache"])
def second_cache(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture
def crash(
    process_factory: support.ProcessFactory,
    sql_cluster_ready: LocalCluster,
    app_db_url: str,
    second_cache: bool,
    tmp_path: Path,
) -> Iterator[Crash]:
    """The cluster and a fresh database with this module's table."""
    engine = create_framework_engine(app_db_url)
    try:
        Base.metadata.create_all(engine)
    finally:
        engine.dispose()
    yield Crash(
        process_factory,
        sql_cluster_ready,
        app_db_url,
        f"batchcrash-{support.unique_suffix()}",
        tmp_path,
        second_cache,
    )


@dataclass(frozen=True, slots=True)
class Reported:
    """What the killed instance reported: the counter's partition and each member's outcome."""

    partition: int
    members: dict[str, int]  # idempotency key -> transaction ID of its committed outcome


def start_instance(
    crash: Crash, counter_id: int, key_prefix: str, failpoint: str
) -> tuple[ManagedProcess, Path]:
    """Start ``batch_instance.py`` with ``failpoint``; returns the process and its report file."""
    report = crash.work_dir / "report.json"
    args = [
        sys.executable,
        str(INSTANCE_SCRIPT),
        "--db",
        crash.db_url,
        "--zookeeper",
        crash.cluster.zookeeper_connect_string,
        "--root",
        crash.cluster.root,
        "--cluster-name",
        crash.cluster_name,
        "--counter-id",
        str(counter_id),
        "--members",
        str(MEMBERS),
        "--key-prefix",
        key_prefix,
        "--report-file",
        str(report),
        "--failpoint",
        failpoint,
    ]
    process = crash.process_factory(
        args, name="batch-instance", env={**os.environ, **crash.cluster.client_env()}
    )
    process.start()
    return process, report


def read_report(path: Path) -> Reported:
    report = json.loads(path.read_text())
    return Reported(int(report["partition"]), {str(k): int(t) for k, t in report["members"]})


def counter_value(engine: sa.Engine, counter_id: int) -> int | None:
    with engine.connect() as conn:
        return conn.execute(sa.select(HotCounter.value).where(HotCounter.counter_id == counter_id)).scalar()


def recorded_keys(engine: sa.Engine, cluster_name: str, prefix: str) -> list[tuple[str, int, int]]:
    """Every ``(key, partition, transaction)`` row of the keys starting with ``prefix``."""
    t = idempotency_keys
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(t.c.idempotency_key, t.c.partition_id, t.c.transaction_id).where(
                (t.c.cluster_name == cluster_name) & t.c.idempotency_key.startswith(prefix)
            )
        )
        return sorted((str(k), int(p), int(x)) for k, p, x in rows)


def check_second_instance_applies_the_batch_once(
    crash: Crash, counter_id: int, prefix: str, reported: Reported
) -> None:
    """A second instance catches up; the counter rose by exactly the members; each key is
    recorded once against the batch's transaction; each request sent again is answered as
    already applied with that transaction's ID, and appends nothing; copies sent again without
    the attempt's key check (as copies in flight would be) commit, and their apply changes
    nothing."""
    pid = reported.partition
    batch_ids = set(reported.members.values())
    assert len(reported.members) == MEMBERS and len(batch_ids) == 1, (
        f"expected {MEMBERS} members in one batch, got transactions {sorted(batch_ids)}"
    )
    (batch_id,) = batch_ids
    engine = create_framework_engine(crash.db_url)
    try:
        # What the killed instance left: nothing of the batch (held before it, or rolled back).
        assert counter_value(engine, counter_id) == 0, "the killed instance's apply of the batch survived"
        assert recorded_keys(engine, crash.cluster_name, prefix) == []

        callbacks = BatchCrashCallbacks(
            engine, cluster_name=crash.cluster_name, entity_cache=crash.second_cache
        )
        config = WaltzClientConfig(**crash.cluster.client_settings(), zookeeper_session_timeout=10.0)
        with WaltzClient(callbacks, config) as client:
            client.wait_mounted(TIMEOUT)
            assert callbacks.wait_for(pid, batch_id, timeout=TIMEOUT), (
                f"the second instance did not apply partition {pid} transaction {batch_id}"
            )
            assert counter_value(engine, counter_id) == MEMBERS, "a member was lost or applied twice"
            assert recorded_keys(engine, crash.cluster_name, prefix) == sorted(
                (key, pid, batch_id) for key in reported.members
            )
            for key in reported.members:
                assert callbacks.find_idempotency_key(key) == AppliedRequest(pid, batch_id)

            # Every request again, as one batch behind a gate: each is already applied, earlier.
            client.flush(TIMEOUT)
            mark_before = client.get_high_water_mark(pid)
            with EntityBatcher(client) as batcher:
                keys = list(reported.members)
                increments = [KeyedIncrement(callbacks, counter_id, key) for key in keys]
                gated, futures = submit_behind_gate(batcher, Gate(callbacks, counter_id), increments)
                assert gated.result(TIMEOUT).dropped
                again = {key: future.result(TIMEOUT) for key, future in zip(keys, futures, strict=True)}
            wrong = {
                key: outcome
                for key, outcome in again.items()
                if outcome.kind is not OutcomeKind.ALREADY_APPLIED
                or (outcome.partition_id, outcome.transaction_id) != (pid, batch_id)
            }
            assert wrong == {}, f"requests sent again not answered as already applied in {batch_id}: {wrong}"
            client.flush(TIMEOUT)
            assert client.get_high_water_mark(pid) == mark_before, "a request sent again was appended"
            assert callbacks.wait_for(pid, mark_before, timeout=TIMEOUT)
            assert counter_value(engine, counter_id) == MEMBERS
            assert len(recorded_keys(engine, crash.cluster_name, prefix)) == MEMBERS

            # Copies the attempt does not check: each commits, and its apply changes nothing. A
            # copy after another in a batch does not read the counter that copy left (its apply
            # skips it): it runs on its own after the batch, so the copies go one by one.
            with EntityBatcher(client) as batcher:
                copies = [KeyedIncrement(callbacks, counter_id, key) for key in keys]
                for copy in copies:
                    copy.checks_idempotency_key = False
                gated, futures = submit_behind_gate(batcher, Gate(callbacks, counter_id), copies)
                assert gated.result(TIMEOUT).dropped
                copied = [future.result(TIMEOUT) for future in futures]
            assert all(outcome.committed for outcome in copied), copied
            copy_ids = [outcome.transaction_id for outcome in copied]
            assert all(i is not None and i > batch_id for i in copy_ids), copy_ids
            assert len(set(copy_ids)) == len(copy_ids), f"copies shared a log transaction: {copy_ids}"
            copy_id = max(i for i in copy_ids if i is not None)
            assert callbacks.wait_for(pid, copy_id, timeout=TIMEOUT)
            assert counter_value(engine, counter_id) == MEMBERS, "a copy of a request was applied again"
            assert recorded_keys(engine, crash.cluster_name, prefix) == sorted(
                (key, pid, batch_id) for key in reported.members
            )
            assert list(callbacks.uncaught) == []
    finally:
        engine.dispose()


def test_a_batch_committed_and_never_applied_by_its_killed_instance_is_applied_once_by_another(
    crash: Crash,
) -> None:
    """Killed after the commit, before the apply: the instance's applies of the partition are
    held, it reports every member committed, and the test kills it with SIGKILL."""
    counter_id = random.Random().randrange(1, 1 << 62)
    prefix = f"held-{uuid.uuid4().hex[:12]}"
    process, report = start_instance(crash, counter_id, prefix, "hold-apply")
    process.wait_ready(
        report.exists, timeout=3 * TIMEOUT, what="the instance to report its members committed"
    )
    reported = read_report(report)
    assert process.kill() == -9, "the instance did not die of SIGKILL"
    check_second_instance_applies_the_batch_once(crash, counter_id, prefix, reported)


def test_a_batch_whose_apply_is_killed_after_its_first_member_is_applied_once_by_another(
    crash: Crash,
) -> None:
    """Killed inside the apply of the batch, after members 0 and 1 wrote and before the database
    transaction commits (the instance's own failpoint, SIGKILL)."""
    counter_id = random.Random().randrange(1, 1 << 62)
    prefix = f"inapply-{uuid.uuid4().hex[:12]}"
    process, report = start_instance(crash, counter_id, prefix, "kill-in-apply")
    # It may die at its failpoint as soon as the report is written.
    wait_until(
        lambda: report.exists() or not process.is_running(),
        timeout=3 * TIMEOUT,
        what="the instance to report its members committed, or to die",
    )
    assert report.exists(), f"the instance died before its report; its log ends with:\n{process.log_tail()}"
    reported = read_report(report)
    assert process.wait(TIMEOUT) == -9, "the instance did not die of SIGKILL"
    assert process.log_path is not None
    failpoint = re.search(FAILPOINT_PATTERN, process.log_path.read_text())
    assert failpoint is not None, "the instance died without logging its failpoint"
    assert (int(failpoint["partition"]), int(failpoint["member"])) == (reported.partition, 1)
    assert int(failpoint["value"]) == 2, "the apply had not written members 0 and 1 when it was killed"
    assert {int(failpoint["transaction"])} == set(reported.members.values())
    check_second_instance_applies_the_batch_once(crash, counter_id, prefix, reported)
