"""``waltz chaos`` in the default suite (short) and on demand (the full run, ``-m slow``).

The short run (3,000 transactions, fixed seed, three fixed faults: kill -9 of a storage
node, kill -9 of a server, a cut between the servers and a storage node) must pass every check;
the full run (1,000,000 transactions, 5 storage nodes, random schedule of every fault kind,
ZooKeeper kills and pauses included) runs with ``-m slow``. The tests assert the invariants, never
that no failover happened.

Unit tests of the pieces that can fail on their own: the fault proxy (cut, block, delay), the
schedules (seeded, minority only), and the on-disk replica comparison (a flipped byte is caught).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from waltz.chaos import ChaosOptions, FaultKind, FaultProxy, fixed_schedule, parse_fault_kinds, run_chaos
from waltz.chaos.archive_checks import check_chunks_once, check_local_ranges, local_ranges
from waltz.chaos.checks import (
    LogObserver,
    LogReading,
    WorkerResult,
    check_replicas_on_disk,
    check_run,
    segment_digests,
)
from waltz.chaos.schedule import (
    ARCHIVE_FAULTS,
    DEFAULT_FAULTS,
    NAMESPACE_FAULTS,
    NETWORK_FAULTS,
    OWNER_PAUSE_MARGIN,
    SPLIT_FAULTS,
    random_schedule,
)
from waltz.chaos.sequence import ChecksumCallbacks, counter_key_for, counter_payload, payload_for
from waltz.client.transaction import Transaction
from waltz.local.zookeeper import find_java, find_zookeeper_classpath
from waltz.protocol.records import Record, ReqId
from waltz.services.storage import format as fmt
from waltz.services.storage.inspect.reader import SegmentFile


def _require_zookeeper() -> None:
    try:
        find_java()
        find_zookeeper_classpath()
    except Exception as exc:  # ConfigurationError: java or the jars are missing
        import support

        support.unavailable(f"ZooKeeper cannot run here: {exc}")


# --- the fault proxy ------------------------------------------------------------------------------


@pytest.fixture
def echo_server() -> Iterator[int]:
    """A loopback TCP echo server; yields its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.2)
    done = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            while chunk := conn.recv(65536):
                conn.sendall(chunk)

    def accept() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        done.set()
        listener.close()
        thread.join(5)


def _roundtrip(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(payload)
        received = b""
        while len(received) < len(payload):
            chunk = conn.recv(65536)
            if not chunk:
                break
            received += chunk
        return received


def test_proxy_forwards_delays_cuts_and_blocks(echo_server: int) -> None:
    with FaultProxy(lambda: ("127.0.0.1", echo_server), name="echo") as proxy:
        payload = bytes(range(256)) * 1000
        assert _roundtrip(proxy.port, payload) == payload

        proxy.set_delay(0.3)
        started = time.monotonic()
        assert _roundtrip(proxy.port, b"slow") == b"slow"
        assert time.monotonic() - started >= 0.55  # 0.3 s each way
        proxy.set_delay(0.0)

        conn = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        conn.sendall(b"x")
        assert conn.recv(1) == b"x"
        proxy.cut()
        with pytest.raises(OSError):
            for _ in range(50):  # the abort reaches us as a reset or an end of stream
                conn.sendall(b"y")
                if conn.recv(1) == b"":
                    raise ConnectionResetError("end of stream")
                time.sleep(0.02)
        conn.close()
        assert _roundtrip(proxy.port, b"again") == b"again"  # a cut is a blip

        proxy.block()
        try:
            got = _roundtrip(proxy.port, b"blocked")
        except OSError:  # refused by a reset rather than an end of stream
            got = b""
        assert got == b""
        assert proxy.refused >= 1
        proxy.unblock()
        assert _roundtrip(proxy.port, b"open") == b"open"


# --- schedules ------------------------------------------------------------------------------------


def test_random_schedule_is_seeded_and_hits_only_a_minority() -> None:
    kinds = tuple(FaultKind)
    first = random_schedule(42, kinds, count=200, storages=5, servers=3)
    assert first == random_schedule(42, kinds, count=200, storages=5, servers=3)
    assert first != random_schedule(43, kinds, count=200, storages=5, servers=3)
    assert [f.at for f in first] == sorted(f.at for f in first)
    assert {f.kind for f in first} == set(kinds) - SPLIT_FAULTS  # a split is scheduled by --split-to
    for fault in first:
        if "storage" in fault.kind.value:
            assert 1 <= len(fault.targets) <= 2 and all(0 <= t < 5 for t in fault.targets)
        elif "zookeeper" in fault.kind.value or fault.kind is FaultKind.KILL_ARCHIVER:
            assert fault.targets == ()
        else:
            assert len(fault.targets) == 1 and 0 <= fault.targets[0] < 3
    three = random_schedule(1, kinds, count=100, storages=3, servers=3)
    assert all(len(f.targets) <= 1 for f in three)


def test_pause_owner_faults_target_a_partition_and_outlast_the_session_timeout() -> None:
    schedule = random_schedule(
        5, (FaultKind.PAUSE_OWNER,), count=50, storages=3, servers=3, partitions=4, session_timeout=4.0
    )
    assert {f.targets for f in schedule} == {(0,), (1,), (2,), (3,)}
    shortest, longest = 4.0 + OWNER_PAUSE_MARGIN + 1.0, 4.0 + OWNER_PAUSE_MARGIN + 6.0
    assert all(shortest <= f.duration <= longest for f in schedule)
    assert "pause-owner of partition" in schedule[0].describe()
    assert parse_fault_kinds("pause-owner") == (FaultKind.PAUSE_OWNER,)


def test_fault_kinds_parse() -> None:
    assert parse_fault_kinds("all") == DEFAULT_FAULTS
    assert not set(DEFAULT_FAULTS) & NAMESPACE_FAULTS
    assert (
        set(parse_fault_kinds("all", "namespaces"))
        == set(FaultKind) - NETWORK_FAULTS - ARCHIVE_FAULTS - SPLIT_FAULTS
    )
    assert set(parse_fault_kinds("all", archive=True)) == set(DEFAULT_FAULTS) | ARCHIVE_FAULTS
    assert parse_fault_kinds("none") == ()
    assert parse_fault_kinds("kill-storage, cut-clients") == (FaultKind.KILL_STORAGE, FaultKind.CUT_CLIENTS)
    with pytest.raises(ValueError, match="unknown fault kind"):
        parse_fault_kinds("kill-everything")
    assert [f.kind for f in fixed_schedule()] == [
        FaultKind.KILL_STORAGE,
        FaultKind.KILL_SERVER,
        FaultKind.CUT_STORAGE,
    ]


# --- the checks catch what they are for ------------------------------------------------------------


def _apply(callbacks: ChecksumCallbacks, partition: int, transaction_id: int, data: bytes) -> None:
    req_id = ReqId(1, 1, partition, transaction_id)
    callbacks.apply_transactions([Transaction(partition, transaction_id, req_id, 0, None, data)])


def _read(seed: int, log: list[bytes], workload: str = "raw", keys: int = 10) -> LogReading:
    """What a reader sees of a one-partition log holding ``log`` (transaction IDs 0, 1, ...)."""
    reading = LogReading()
    observer = LogObserver(reading, seed, workload, keys)
    callbacks = ChecksumCallbacks(observer)
    for tid, data in enumerate(log):
        _apply(callbacks, 0, tid, data)
    state = callbacks.sequence(0)
    reading.marks[0], reading.checksums[0], reading.counts[0] = state.mark, state.checksum, state.count
    reading.counter_keys = len(observer.values)
    return reading


def _worker(acked: list[tuple[int, int, int]], reading: LogReading) -> WorkerResult:
    return WorkerResult(0, 7, acked, [], 0, {0: (reading.marks[0], reading.checksums[0], 0, [])}, [])


def test_checks_catch_lost_doubled_and_damaged_transactions() -> None:
    log = [payload_for(9, 0, s) for s in range(3)]
    good = _read(9, log)
    acked = [(0, 0, 0), (1, 0, 1), (2, 0, 2)]
    assert all(
        c.passed
        for c in check_run(workers=[_worker(acked, good)], submitted={0: 3}, marks={0: 2}, reading=good)
    )

    def failed(reading: LogReading, acked: list[tuple[int, int, int]], mark: int) -> set[str]:
        checks = check_run(workers=[_worker(acked, good)], submitted={0: 3}, marks={0: mark}, reading=reading)
        return {c.name for c in checks if not c.passed}

    lost = _read(9, log[:2])  # the third acknowledged transaction is not in the log
    assert "every acknowledged transaction is in the log exactly once" in failed(lost, acked, 1)
    doubled = _read(9, [*log, log[1]])
    assert "no transaction in the log twice, none unsubmitted or damaged" in failed(doubled, acked, 3)
    damaged = _read(9, [log[0], log[1][:-1] + b"?", log[2]])
    assert "no transaction in the log twice, none unsubmitted or damaged" in failed(damaged, acked, 2)
    # A client whose checksum differs from the reader's (it applied something else).
    other = _read(9, [log[0], log[2], log[1]])
    checks = check_run(workers=[_worker(acked, other)], submitted={0: 3}, marks={0: 2}, reading=good)
    assert "every client applied the same sequence as a fresh reader (checksums match)" in {
        c.name for c in checks if not c.passed
    }


#: The checks on the clients' outcomes (docs/chaos.md "The checks").
_PROGRESS = "the clients made progress (submissions acknowledged)"
_DEFINITE = "no submission that failed for certain is in the log"
_COMPLETE = "every client's outcomes cover its submissions, each once"


def _outcomes(
    acked: list[tuple[int, int, int]], failed: list[tuple[int, str]], reading: LogReading, submitted: int
) -> dict[str, tuple[bool, str]]:
    """Every check's verdict and detail for one worker's outcomes against a one-partition log."""
    worker = WorkerResult(
        0, 7, acked, failed, 0, {0: (reading.marks[0], reading.checksums[0], 0, [])}, [], submitted=submitted
    )
    checks = check_run(
        workers=[worker], submitted={0: submitted}, marks={0: reading.marks[0]}, reading=reading
    )
    return {c.name: (c.passed, c.detail) for c in checks}


def test_a_run_with_nothing_acknowledged_fails_though_every_submission_committed() -> None:
    """Every submission failed with an ambiguous error (its acknowledgement lost) while the log
    holds every one: nothing was acknowledged, so the run made no progress and fails; the failures
    that committed anyway are reported with their kinds."""
    reading = _read(9, [payload_for(9, 0, s) for s in range(3)])
    verdicts = _outcomes([], [(s, "TimeoutError('acknowledgement lost')") for s in range(3)], reading, 3)
    passed, detail = verdicts[_PROGRESS]
    assert not passed and "0 of 3 submissions acknowledged" in detail, detail
    passed, detail = verdicts[_DEFINITE]
    assert passed and "3 of 3 failed submissions committed anyway" in detail, detail
    assert "TimeoutError: 3" in detail, detail


@pytest.mark.parametrize(
    "error",
    [
        "TransactionExpiredError('transaction context on partition 0 expired after 2 attempt(s)')",
        "PartitionPausedError('partition 0 waits for an upgrade')",
        "ClientAheadOfLogError('partition 0: refused the mount')",
        "StalePartitionEpochError('stale partition epoch: sealed')",
        "execute returned False",
    ],
)
def test_a_submission_that_failed_for_certain_and_is_in_the_log_fails_the_run(error: str) -> None:
    """An error that tells the application its transaction did not and will not commit, found
    committed in the log: the client lied, the run fails naming the submission."""
    reading = _read(9, [payload_for(9, 0, s) for s in range(3)])
    verdicts = _outcomes([(0, 0, 0), (1, 0, 1)], [(2, error)], reading, 3)
    passed, detail = verdicts[_DEFINITE]
    assert not passed, detail
    kind = error.partition("(")[0]
    assert "writer 0 #2" in detail and kind in detail and "(0, 2)" in detail, detail
    # The same failure not in the log is what the error said: the run passes.
    shorter = _read(9, [payload_for(9, 0, s) for s in range(2)])
    assert all(passed for passed, _ in _outcomes([(0, 0, 0), (1, 0, 1)], [(2, error)], shorter, 3).values())


@pytest.mark.parametrize(
    "error",
    [
        "TimeoutError('acknowledgement lost')",
        "WaltzTimeoutError('flush did not finish')",
        "ClientClosedError('closed with the transaction in flight; it may or may not have been committed')",
        "ConnectionError('connection reset')",
    ],
)
def test_a_submission_of_unknown_fate_found_in_the_log_passes_and_is_reported(error: str) -> None:
    reading = _read(9, [payload_for(9, 0, s) for s in range(3)])
    verdicts = _outcomes([(0, 0, 0), (1, 0, 1)], [(2, error)], reading, 3)
    assert all(passed for passed, _ in verdicts.values()), verdicts
    detail = verdicts[_DEFINITE][1]
    kind = error.partition("(")[0]
    assert f"1 of 1 failed submissions committed anyway ({kind}: 1)" in detail, detail


def test_outcomes_that_do_not_cover_the_submissions_once_fail_naming_the_sequences() -> None:
    """Each worker's acknowledged and failed sequences must be 0..n-1, each once, n its own count
    of submissions: an outcome recorded twice, or one missing, is named."""
    reading = _read(9, [payload_for(9, 0, s) for s in range(4)])
    acked = [(s, 0, s) for s in range(4)]
    assert all(passed for passed, _ in _outcomes(acked, [], reading, 4).values())
    passed, detail = _outcomes([*acked, acked[0]], [], reading, 4)[_COMPLETE]
    assert not passed and "worker 0: duplicated [0]" in detail, detail
    passed, detail = _outcomes([a for a in acked if a[0] != 2], [], reading, 4)[_COMPLETE]
    assert not passed and "worker 0: missing [2]" in detail, detail
    passed, detail = _outcomes(acked[:3], [(3, "TimeoutError()"), (3, "TimeoutError()")], reading, 4)[
        _COMPLETE
    ]
    assert not passed and "worker 0: duplicated [3]" in detail, detail
    passed, detail = _outcomes(acked, [(4, "TimeoutError()")], reading, 4)[_COMPLETE]
    assert not passed and "worker 0: outside 0..3 [4]" in detail, detail
    worker = WorkerResult(0, 7, acked, [], 0, {0: (reading.marks[0], reading.checksums[0], 0, [])}, [])
    checks = check_run(workers=[worker], submitted={}, marks={0: 3}, reading=reading)
    missing = next(c for c in checks if c.name == _COMPLETE)
    assert not missing.passed and "worker 0: its result gives no count of submissions" in missing.detail
    raw = {
        "worker": 0, "client_id": 7, "acked": acked, "failed": [], "lock_failures": 0,
        "partitions": {}, "uncaught": [], "submitted": 4,
    }  # fmt: skip
    assert WorkerResult.from_json(raw).submitted == 4


def test_generation_check_catches_a_stale_owner_committing_after_a_takeover() -> None:
    log = [payload_for(9, 0, s) for s in range(4)]
    acked = [(s, 0, s) for s in range(4)]

    def read(generations: list[int]) -> LogReading:
        reading = LogReading()
        callbacks = ChecksumCallbacks(LogObserver(reading, 9, "raw", 10))
        for tid, (data, generation) in enumerate(zip(log, generations, strict=True)):
            req_id = ReqId(1, generation, 0, tid)
            callbacks.apply_transactions([Transaction(0, tid, req_id, 0, None, data)])
        state = callbacks.sequence(0)
        reading.marks[0], reading.checksums[0], reading.counts[0] = state.mark, state.checksum, state.count
        return reading

    name = "generations never go back in a partition's log (no stale owner committed after a takeover)"

    def verdict(reading: LogReading) -> bool:
        checks = check_run(workers=[_worker(acked, reading)], submitted={0: 4}, marks={0: 3}, reading=reading)
        return next(c for c in checks if c.name == name).passed

    assert verdict(read([1, 1, 2, 2]))
    stale = read([1, 2, 1, 2])  # generation 1 wrote after generation 2 took over
    assert not verdict(stale)
    assert stale.generation_errors == ["(0, 2): generation 1 after 2"]


def test_counter_check_catches_a_lost_update() -> None:
    keys = 1
    increments = [counter_payload(0, s, counter_key_for(4, 0, s, keys), s + 1) for s in range(3)]
    assert _read(4, increments, "counter", keys).counter_errors == []
    lost = [*increments[:2], counter_payload(0, 2, counter_key_for(4, 0, 2, keys), 2)]  # read a stale value
    assert len(_read(4, lost, "counter", keys).counter_errors) == 1


def test_callbacks_refuse_gaps_and_repeats() -> None:
    callbacks = ChecksumCallbacks()
    _apply(callbacks, 0, 0, b"a")
    _apply(callbacks, 0, 0, b"a")
    _apply(callbacks, 0, 2, b"c")
    state = callbacks.sequence(0)
    assert state.mark == 0 and len(state.errors) == 2


# --- the short run, and the replica check catching a damaged replica -------------------------------


def test_short_chaos_run_keeps_every_invariant(tmp_path: Path) -> None:
    """3,000 transactions, seed 1, the three fixed faults; then a flipped byte on one replica is caught."""
    _require_zookeeper()
    lines: list[str] = []
    options = ChaosOptions(
        transactions=3000, seed=1, schedule="fixed", work_dir=tmp_path / "chaos", keep=True
    )
    result = run_chaos(options, lines.append)
    report = "\n".join(lines)
    assert result.passed, report
    names = [c.name for c in result.checks]
    for expected in (
        "every acknowledged transaction is in the log exactly once",
        "no gaps in transaction IDs, nothing applied twice",
        "every client applied the same sequence as a fresh reader (checksums match)",
        "all replicas byte-identical on disk (CRC-32 of every segment body)",
        "after a clean restart of everything, a fresh reader sees the same",
    ):
        assert expected in names, report
    assert len(result.faults) == 3, report
    assert result.acknowledged + result.failed == 3000, report
    assert "replay: waltz chaos --seed 1" in report

    # The on-disk check is not vacuous: flip one byte of one replica's segment body.
    storage_dirs = {p.name: p for p in sorted((tmp_path / "chaos" / "cluster").glob("storage-*"))}
    digests = segment_digests(storage_dirs)
    marks = {pid: next(iter(held.values())).records - 1 for pid, held in digests.items()}
    assert check_replicas_on_disk(digests, marks, 3).passed
    segment = sorted((storage_dirs["storage-1"]).glob("*/*.seg"))[0]
    original = segment.read_bytes()
    data = bytearray(original)
    data[200] ^= 0xFF
    segment.write_bytes(bytes(data))
    damaged = check_replicas_on_disk(segment_digests(storage_dirs), marks, 3)
    assert not damaged.passed, damaged.detail
    # A replica whose records are all valid but one differs (another payload of the same length,
    # its CRC right): only the comparison of segment bodies between replicas can catch that.
    record, size = fmt.decode_record_at(original, fmt.HEADER_SIZE)
    other = Record.create(record.transaction_id, record.req_id, record.header, bytes(len(record.data)))
    assert other.data != record.data and len(fmt.encode_record(other)) == size
    data = bytearray(original)
    data[fmt.HEADER_SIZE : fmt.HEADER_SIZE + size] = fmt.encode_record(other)
    segment.write_bytes(bytes(data))
    differing = check_replicas_on_disk(segment_digests(storage_dirs), marks, 3)
    assert not differing.passed, differing.detail
    segment.write_bytes(original)
    assert check_replicas_on_disk(segment_digests(storage_dirs), marks, 3).passed


def test_options_replay_and_duration() -> None:
    """The replay line names what shapes a run; --duration makes the transactions a bound only."""
    options = ChaosOptions(seed=7, workload="counter", lock_pool=40, clients=2, partitions=2)
    line = options.replay_command()
    for part in ("--seed 7", "--transactions 3000", "--workload counter", "--lock-pool 40", "--clients 2"):
        assert part in line, line
    timed = ChaosOptions(duration=120.0)
    assert timed.transaction_bound > 10**6 and "--duration 120" in timed.replay_command()
    assert "--transactions" not in timed.replay_command()
    assert len(timed.make_schedule()) == 4  # one fault per 30 s of the duration
    ledger = ChaosOptions(workload="ledger", accounts=50, app="bank_of_the_test").replay_command()
    assert "--accounts 50" in ledger and "--app bank_of_the_test" in ledger, ledger
    assert "--app" not in ChaosOptions(workload="ledger").replay_command()  # the default
    assert "--batch" in ChaosOptions(workload="ledger", batch=True).replay_command()
    assert "--batch" not in ChaosOptions(workload="ledger").replay_command()
    with pytest.raises(ValueError, match="--batch is for the ledger workload, not --workload counter"):
        ChaosOptions(workload="counter", batch=True).validate()
    with pytest.raises(ValueError, match="--db-url is the ledger workload's database, not --workload raw's"):
        ChaosOptions(db_url="postgresql+psycopg://postgres@127.0.0.1/test").validate()
    with pytest.raises(ValueError, match="storages must be 3 or 5"):
        ChaosOptions(storages=4).validate()
    with pytest.raises(ValueError, match="at least clients"):
        ChaosOptions(transactions=2, clients=3).validate()


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("postgresql+psycopg://app:s3cret-word@127.0.0.1:notaport/ledger", "its port is not a number"),
        ("postgresql+psycopg://postgres@127.0.0.1:1/ledger", "cannot connect"),
        (
            "postgresql+psycopg_async://app:s3cret-word@127.0.0.1/ledger",
            "an asyncio driver; give the synchronous URL postgresql+psycopg://app:***@127.0.0.1/ledger",
        ),
    ],
)
def test_a_ledger_database_that_cannot_work_is_refused_before_the_cluster_starts(url: str, said: str) -> None:
    from typer.testing import CliRunner

    from waltz.cli.main import app

    result = CliRunner().invoke(app, ["chaos", "--workload", "ledger", "--db-url", url])
    assert result.exit_code == 2, result.output
    assert said in result.stderr and "cluster ready" not in result.output
    assert "s3cret-word" not in result.output + result.stderr


def test_a_fixed_schedule_striking_what_the_cluster_lacks_is_refused() -> None:
    """The fixed schedules strike server 1, and in namespace mode partition 1's owner: a cluster
    without them is refused before anything starts (docs/chaos.md "The fault schedule")."""
    from typer.testing import CliRunner

    from waltz.cli.main import app

    with pytest.raises(ValueError, match=r"needs --servers 2 or more \(kill-server of server 1\): give them"):
        ChaosOptions(schedule="fixed", servers=1, transactions=300).validate()
    ChaosOptions(
        schedule="fixed", servers=1, faults=(FaultKind.KILL_STORAGE, FaultKind.CUT_STORAGE)
    ).validate()
    ChaosOptions(schedule="random", servers=1, partitions=1).validate()
    namespaces = tuple(sorted(NAMESPACE_FAULTS, key=lambda k: k.value))
    with pytest.raises(ValueError) as raised:
        ChaosOptions(
            network="namespaces", faults=namespaces, schedule="fixed", servers=1, partitions=1
        ).validate()
    assert (
        "--servers 2 or more (isolate-server of server 1) and --partitions 2 or more (one-way-owner "
        in str(raised.value)
    )
    result = CliRunner().invoke(
        app, ["chaos", "--schedule", "fixed", "--servers", "1", "--transactions", "300"]
    )
    assert result.exit_code == 2, result.output
    assert "--servers 2 or more" in result.stderr and "cluster ready" not in result.output


def test_a_schedule_the_chosen_fault_kinds_leave_empty_is_refused_unless_no_faults_were_asked_for() -> None:
    """The fixed schedule strikes kill-storage, kill-server and cut-storage: --faults without any of
    them leaves it empty, which is refused (exit 2) rather than run as a run without faults; --faults
    none and --fault-count 0 ask for no faults and run (docs/chaos.md "The fault schedule")."""
    from typer.testing import CliRunner

    from waltz.cli.main import app

    zookeeper_and_owner = (FaultKind.PAUSE_ZOOKEEPER, FaultKind.KILL_ZOOKEEPER, FaultKind.PAUSE_OWNER)
    with pytest.raises(ValueError) as raised:
        ChaosOptions(schedule="fixed", faults=zookeeper_and_owner).validate()
    said = str(raised.value)
    assert (
        "--faults pause-zookeeper,kill-zookeeper,pause-owner leaves the fixed schedule without a fault"
        in said
    )
    assert "kill-storage, kill-server, cut-storage" in said and "--faults none" in said, said
    with pytest.raises(ValueError, match="leaves the fixed schedule without a fault"):
        ChaosOptions(network="namespaces", schedule="fixed", faults=(FaultKind.KILL_SERVER,)).validate()
    ChaosOptions(schedule="fixed", faults=()).validate()
    ChaosOptions(schedule="random", faults=()).validate()
    ChaosOptions(schedule="random", fault_count=0).validate()
    ChaosOptions(schedule="random", faults=zookeeper_and_owner).validate()
    kinds = "pause-zookeeper,kill-zookeeper,pause-owner"
    arguments = ["chaos", "--schedule", "fixed", "--faults", kinds, "--transactions", "300"]
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 2, result.output
    assert "leaves the fixed schedule without a fault" in result.stderr, result.stderr
    assert "fault schedule" not in result.stdout, result.stdout


def test_a_work_dir_that_holds_an_earlier_run_is_refused(tmp_path: Path) -> None:
    """A run starts a new cluster: the kept one of an earlier run (its fault proxies' ports in its
    layout, its log) is refused, not resumed (docs/chaos.md "Work directory")."""
    from typer.testing import CliRunner

    from waltz.cli.main import app

    earlier = tmp_path / "earlier"
    (earlier / "cluster").mkdir(parents=True)
    (earlier / "cluster" / "cluster.json").write_text("{}")
    (earlier / "archiver.log").write_text("")
    with pytest.raises(ValueError, match=r"holds an earlier run \(cluster, archiver.log\)"):
        ChaosOptions(work_dir=earlier).validate()
    ChaosOptions(work_dir=tmp_path / "new").validate()
    (tmp_path / "empty").mkdir()
    ChaosOptions(work_dir=tmp_path / "empty").validate()
    result = CliRunner().invoke(app, ["chaos", "--schedule", "fixed", "--work-dir", str(earlier)])
    assert result.exit_code == 2, result.output
    assert "holds an earlier run" in result.stderr and "cluster ready" not in result.output


def test_archive_options_and_schedule() -> None:
    """--archive adds the archiving kinds to the fixed schedule; they are refused without it."""
    archiving = parse_fault_kinds("all", archive=True)
    options = ChaosOptions(schedule="fixed", faults=archiving, archive=True)
    options.validate()
    assert [f.kind for f in options.make_schedule()] == [
        FaultKind.KILL_STORAGE,
        FaultKind.KILL_SERVER_ARCHIVING,
        FaultKind.KILL_ARCHIVER,
        FaultKind.KILL_STORAGE_ARCHIVING,
        FaultKind.CUT_STORAGE,
    ]
    assert options.replay_command().endswith("--archive")
    with pytest.raises(ValueError, match="need the archiver: add --archive"):
        ChaosOptions(faults=(FaultKind.KILL_ARCHIVER,)).validate()
    with pytest.raises(ValueError, match="loopback only"):
        ChaosOptions(archive=True, network="namespaces", faults=()).validate()
    drawn = random_schedule(3, archiving, count=60, storages=3, servers=3)
    assert {f.kind for f in drawn} & ARCHIVE_FAULTS
    assert all(len(f.targets) == 1 for f in drawn if f.kind is FaultKind.KILL_STORAGE_ARCHIVING)
    assert all(f.targets == () for f in drawn if f.kind is FaultKind.KILL_ARCHIVER)


@pytest.mark.slow
@pytest.mark.timeout(6 * 3600)
def test_full_chaos_run_with_random_faults(tmp_path: Path) -> None:
    """1,000,000 transactions, 5 storage nodes, a random schedule of every fault kind."""
    _require_zookeeper()
    lines: list[str] = []
    options = ChaosOptions(
        transactions=1_000_000,
        seed=20261122,
        storages=5,
        schedule="random",
        fault_count=60,
        in_flight=64,
        work_dir=tmp_path / "chaos",
    )
    kinds = {fault.kind for fault in options.make_schedule()}
    assert {FaultKind.KILL_ZOOKEEPER, FaultKind.PAUSE_ZOOKEEPER} <= kinds, kinds
    result = run_chaos(options, lines.append)
    assert result.passed, "\n".join(lines[-60:])


@pytest.mark.slow
@pytest.mark.parametrize(("workload", "batch"), [("counter", False), ("ledger", False), ("ledger", True)])
def test_short_chaos_run_of_the_other_workloads(tmp_path: Path, workload: str, batch: bool) -> None:
    """The counter (no lost update) and ledger (money conserved) workloads under the fixed faults;
    the ledger also with its instances batching (each member applied exactly once)."""
    _require_zookeeper()
    lines: list[str] = []
    options = ChaosOptions(
        transactions=1500,
        seed=3,
        schedule="fixed",
        workload=workload,
        batch=batch,
        lock_pool=40,
        work_dir=tmp_path / "chaos",
    )
    result = run_chaos(options, lines.append)
    assert result.passed, "\n".join(lines[-60:])
    names = {c.name for c in result.checks}
    if workload == "counter":
        assert "counter: every increment read its key's latest value (no lost update)" in names
    else:
        assert "ledger: money conserved" in names
        assert "ledger: every (transaction, member) applied exactly once" in names, names


@pytest.mark.slow
@pytest.mark.parametrize("workload", ["raw", "counter"])
def test_chaos_run_with_paused_owners(tmp_path: Path, workload: str) -> None:
    """Owners paused past their ZooKeeper session timeout while the workers' flushes wait on them
    (docs/design/server.md "What a client hears from a fenced owner"): nothing lost or doubled."""
    _require_zookeeper()
    lines: list[str] = []
    options = ChaosOptions(
        transactions=3000,
        seed=1,
        faults=(FaultKind.PAUSE_OWNER,),
        fault_count=3,
        workload=workload,
        lock_pool=40 if workload == "counter" else 1000,
        work_dir=tmp_path / "chaos",
    )
    result = run_chaos(options, lines.append)
    assert result.passed, "\n".join(lines[-60:])
    assert len(result.faults) == 3 and all("pause-owner" in f for f in result.faults), result.faults


@pytest.mark.slow  # a chaos run; tests/archive covers each archiver failure on its own
def test_short_chaos_run_with_the_archiver_keeps_every_invariant(tmp_path: Path) -> None:
    """3,000 transactions, seed 1, the fixed schedule of ``--archive``: a server, a storage node and
    the archiver killed while an archive round is in progress; the archive verifies, holds every
    range once, and with the replicas' local ranges every committed record. Then a chunk file
    archived twice and a replica whose local start passed the archive are caught."""
    _require_zookeeper()
    lines: list[str] = []
    options = ChaosOptions(
        transactions=3000,
        seed=1,
        schedule="fixed",
        faults=parse_fault_kinds("all", archive=True),
        archive=True,
        work_dir=tmp_path / "chaos",
        keep=True,
        restart_check=False,
    )
    result = run_chaos(options, lines.append)
    report = "\n".join(lines)
    assert result.passed, report
    names = [c.name for c in result.checks]
    for expected in (
        "every acknowledged transaction is in the log exactly once",
        "no gaps in transaction IDs, nothing applied twice",
        "waltz archive verify passes (every chunk against its manifest, the manifests against ZooKeeper)",
        "the archive's chunks are contiguous from 0, each range archived once",
        "every committed record is in the archive or on every replica (nothing lost)",
        "replicas byte-identical on disk over their common local range (CRC-32 of every record)",
        "every replica serves the same records over the common local range (admin port)",
    ):
        assert expected in names, report
    assert len(result.faults) == 5, report
    assert "an archive round is in progress" in report, report
    assert "--archive" in report

    # Retention deleted archived segments: the fresh reader read those ranges from the archive.
    storage_dirs = {p.name: p for p in sorted((tmp_path / "chaos" / "cluster").glob("storage-*"))}
    ranges = local_ranges(storage_dirs)
    assert any(r.local_start > 0 for held in ranges.values() for r in held.values()), ranges
    marks = {pid: next(iter(held.values())).last for pid, held in ranges.items()}
    archive = tmp_path / "chaos" / "archive"
    chunks, through = check_chunks_once(archive, len(marks))
    assert chunks.passed and all(t >= 0 for t in through.values()), chunks.detail
    assert all(c.passed for c in check_local_ranges(ranges, marks, through, 3))

    # Not vacuous: a range archived twice (a second file over part of a chunk) is caught ...
    directory = archive / "partition_id=0"
    first = sorted(directory.glob("*.parquet"))[0]
    twice = directory / "00000000000000000000-00000000000000000009.parquet"
    twice.write_bytes(first.read_bytes())
    again, _ = check_chunks_once(archive, len(marks))
    assert not again.passed and "overlap" in again.detail, again.detail
    twice.unlink()
    # ... and so is a replica whose records start past what the archive holds (a range lost).
    lower = {pid: -1 for pid in through}
    lost = check_local_ranges(ranges, marks, lower, 3)[0]
    assert not lost.passed and "lost" in lost.detail, lost.detail
    # ... and a record of the common local range that differs on one replica (its CRCs right).
    # The partition's last record, in every replica's local range: in the newest segment that
    # holds one (a segment rolled at the end of the run holds none yet).
    segments = sorted((storage_dirs["storage-1"] / "0").glob("*.seg"), reverse=True)
    for segment in segments:
        with SegmentFile(segment) as opened:
            scanned = list(opened.scan())
        if scanned:
            last = scanned[-1]
            break
    else:
        pytest.fail(f"no record in storage-1's segments of partition 0: {segments}")
    original = segment.read_bytes()
    record = last.record
    other = Record.create(record.transaction_id, record.req_id, record.header, bytes(len(record.data)))
    assert other.data != record.data
    data = bytearray(original)
    data[last.offset : last.offset + last.size] = fmt.encode_record(other)
    segment.write_bytes(bytes(data))
    differing = check_local_ranges(local_ranges(storage_dirs), marks, through, 3)[1]
    assert not differing.passed and "differ" in differing.detail, differing.detail


def test_the_restart_check_of_an_archive_run_catches_a_replica_that_lost_its_newest_records() -> None:
    """Across the restart a replica may lose only archived records at its start: one that holds
    fewer records at its end (a truncated tail, not archived) fails the check, naming them."""
    from waltz.chaos.archive_checks import LocalRange, compare_local_ranges

    held = LocalRange(0, (11, 12, 13, 14), ())
    before = {0: {"storage-0": held, "storage-1": held}}

    def compared(after: LocalRange, archived_through: int) -> tuple[bool, str]:
        check = compare_local_ranges(
            before, {0: {"storage-0": held, "storage-1": after}}, {0: archived_through}
        )
        return check.passed, check.detail

    assert compared(held, -1)[0]
    assert compared(LocalRange(2, (13, 14), ()), 1)[0]  # retention removed archived 0..1 at start
    passed, detail = compared(LocalRange(0, (11, 12, 13), ()), -1)
    assert not passed and "partition 0 on storage-1: holds up to 2, held up to 3 before the restart" in detail
    passed, detail = compared(LocalRange(2, (13,), ()), 1)
    assert not passed and "records 3..3 lost" in detail, detail
    passed, detail = compared(LocalRange(0, (11, 12, 13, 99), ()), -1)
    assert not passed and "changed across the restart" in detail, detail


def test_archive_without_pyarrow_is_refused_before_anything_starts() -> None:
    """In a process where pyarrow cannot be imported (``None`` in ``sys.modules``, as for a missing
    package), ``waltz chaos --archive`` says which extra to install and exits 2 at once."""
    import os
    import subprocess
    import sys

    script = (
        "import sys; sys.modules['pyarrow'] = None\n"
        "from waltz.cli.main import main\n"
        "main(['chaos', '--archive', '--schedule', 'fixed', '--transactions', '300'])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "WALTZ_LOG_LEVEL": "WARNING"},
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--archive: the archiver cannot run: pyarrow is not installed here" in result.stderr, result.stderr
    assert "pip install 'waltz-py[archive]'" in result.stderr, result.stderr
    assert "fault schedule" not in result.stdout, result.stdout


def test_an_archiver_that_exits_on_its_own_is_reported_and_one_killed_is_not(tmp_path: Path) -> None:
    """The run fails as soon as its archiver exits on its own (here: its archive location is a
    file); a ``kill-archiver`` fault's kill is no failure (docs/chaos.md "Archiving under faults")."""
    _require_zookeeper()
    from waltz.chaos.archiving import ChaosArchiver
    from waltz.local.cluster import LocalCluster
    from waltz.local.options import SecurityOptions
    from waltz.local.processes import wait_until

    with LocalCluster(storages=1, servers=1, partitions=1, security=SecurityOptions.plaintext()) as cluster:
        with ChaosArchiver(cluster, tmp_path / "archive", tmp_path / "killed.log") as archiver:
            archiver.start()
            archiver.kill()
            assert archiver.failure() is None
        location = tmp_path / "a-file"
        location.write_text("not an archive")
        with ChaosArchiver(cluster, location, tmp_path / "archiver.log") as archiver:
            assert archiver.failure() is None
            archiver.start()
            failure = wait_until(archiver.failure, timeout=60, what="the archiver to exit on its own")
    assert "the archiver exited on its own with code" in failure, failure
    assert str(tmp_path / "archiver.log") in failure, failure


def test_stopping_during_an_archive_fault_s_wait_ends_it_at_once_without_striking(tmp_path: Path) -> None:
    """An archiving fault waits (up to a minute) for the archiver's next chunk; a run that stops
    meanwhile (SIGTERM, its clients done) ends the wait at once and strikes nothing
    (docs/chaos.md "Archiving under faults"). The archiver never runs here: no chunk comes."""
    import threading

    from waltz.chaos.archiving import ChaosArchiver
    from waltz.chaos.faults import FaultInjector
    from waltz.chaos.schedule import Fault
    from waltz.local.cluster import LocalCluster
    from waltz.local.processes import wait_until

    cluster = LocalCluster(storages=1, servers=1, partitions=1)  # never started: nothing is struck
    archiver = ChaosArchiver(cluster, tmp_path / "archive", tmp_path / "archiver.log")
    lines: list[str] = []
    gates: list[float] = []
    injector = FaultInjector(
        lambda: cluster,
        [Fault(0.0, FaultKind.KILL_ARCHIVER, (), 1.0)],
        lambda: 1.0,
        [],
        [],
        lines.append,
        gate=gates.append,
        archiver=archiver,
    )
    injector.start()
    # The clients are let on to half way to the next point: the fault now waits for a chunk.
    wait_until(lambda: 0.5 in gates, timeout=5, what="the fault to wait for the archiver's chunk")
    started = time.monotonic()
    injector.stop(timeout=30.0)
    assert time.monotonic() - started < 5.0, lines
    assert injector.struck == [] and injector.errors == [], (injector.struck, injector.errors)
    assert any("kill-archiver for 1.0s not struck: the run is stopping" in line for line in lines), lines

    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    assert not archiver.wait_for_chunk(60.0, stop)
    assert time.monotonic() - started < 5.0


def test_a_fault_injector_with_an_empty_schedule_starts_and_stops_cleanly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run without faults (--faults none): the injector lets the clients run to the end at
    once and its thread ends without an error."""
    from waltz.chaos.faults import FaultInjector
    from waltz.local.cluster import LocalCluster

    crashes: list[object] = []
    monkeypatch.setattr(threading, "excepthook", crashes.append)
    cluster = LocalCluster(storages=1, servers=1, partitions=1)  # never started: nothing is struck
    gates: list[float] = []
    lines: list[str] = []
    injector = FaultInjector(lambda: cluster, [], lambda: 0.0, [], [], lines.append, gate=gates.append)
    injector.start()
    injector.stop(timeout=10.0)
    assert crashes == [], crashes
    assert injector.errors == [] and injector.struck == [], (injector.errors, lines)
    assert gates and set(gates) == {1.0}, gates


def test_a_run_without_faults_passes(tmp_path: Path) -> None:
    """--faults none, 300 transactions: the clients, not held by any fault, may have submitted
    everything before the coordinator sees them mounted; the run goes on and passes."""
    _require_zookeeper()
    lines: list[str] = []
    options = ChaosOptions(
        transactions=300, seed=1, faults=(), work_dir=tmp_path / "chaos", restart_check=False
    )
    result = run_chaos(options, lines.append)
    report = "\n".join(lines)
    assert result.passed, report
    assert result.faults == [] and result.acknowledged == 300, report
    assert "fault schedule (random, 0 faults)" in report, report
