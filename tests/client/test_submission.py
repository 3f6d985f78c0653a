"""A context's attempts and its single outcome (retry logic, without a server)."""

from __future__ import annotations

import time

import pytest

from waltz import Outcome, OutcomeKind, PartitionLocalLock, TransactionBuilder, TransactionContext
from waltz.client.submission import Submission
from waltz.errors import MessageTooLargeError, TransactionExpiredError


class Recording(TransactionContext):
    """Executes with a lock; records every call the client makes."""

    def __init__(self, results: list[bool | Exception], timeout: float | None = None) -> None:
        super().__init__(timeout=timeout)
        self.results = results
        self.calls: list[str] = []
        self.marks: list[int] = []

    def partition_id(self, num_partitions: int) -> int:
        return 0

    def execute(self, builder: TransactionBuilder) -> bool:
        self.calls.append("execute")
        self.marks.append(builder.client_high_water_mark)
        builder.set_write_locks([PartitionLocalLock("k", 1)])
        builder.set_raw_data(b"payload")
        result = self.results.pop(0)
        if isinstance(result, Exception):
            raise result
        return result

    def on_completion(self, result: bool) -> None:
        self.calls.append(f"completion:{result}")

    def on_exception(self, exception: BaseException) -> None:
        self.calls.append(f"exception:{type(exception).__name__}")

    def on_lock_failure(self) -> None:
        self.calls.append("lock_failure")

    def on_expiration(self) -> None:
        self.calls.append("expiration")


def make(
    context: Recording, marks: list[int] | None = None, max_bytes: int = 1 << 20
) -> tuple[Submission, list[Submission]]:
    finished: list[Submission] = []
    values = iter(marks or range(100))
    submission = Submission(context, 0, lambda pid: next(values), max_bytes, on_finished=finished.append)
    return submission, finished


def test_attempts_re_execute_with_the_current_high_water_mark_until_committed() -> None:
    context = Recording([True, True, True])
    submission, finished = make(context, marks=[10, 12, 15])
    first = submission.attempt()
    assert first is not None and first.client_high_water_mark == 10 and first.data == b"payload"
    # The append failed (the feed showed a later one of ours): the client runs another attempt.
    second = submission.attempt()
    assert second is not None and second.client_high_water_mark == 12
    submission.lock_failed()  # the second one failed its lock check
    third = submission.attempt()
    assert third is not None and third.client_high_water_mark == 15
    submission.complete(42)
    assert submission.future.result(0).transaction_id == 42
    assert context.calls == ["execute", "execute", "lock_failure", "execute", "completion:True"]
    assert finished == [submission]
    assert submission.attempts == 3 and submission.lock_failures == 1


def test_execute_false_completes_without_append() -> None:
    context = Recording([False])
    submission, finished = make(context)
    assert submission.attempt() is None
    assert submission.future.result(0).dropped
    assert context.calls == ["execute", "completion:False"]
    assert finished == [submission]


class Dropping(Recording):
    """Drops its transaction the way ``drop`` says: a reason, or the request applied before."""

    def __init__(self, drop: str | tuple[int, int]) -> None:
        super().__init__([])
        self.drop = drop

    def execute(self, builder: TransactionBuilder) -> bool:
        self.calls.append("execute")
        if isinstance(self.drop, str):
            return builder.drop(self.drop)
        return builder.drop_as_applied(*self.drop)


def test_a_drop_s_reason_and_an_earlier_application_reach_the_outcome() -> None:
    refused = Dropping("insufficient funds")
    submission, finished = make(refused)
    assert submission.attempt() is None
    assert submission.future.result(0) == Outcome(OutcomeKind.DROPPED, 0, None, "insufficient funds")
    assert refused.calls == ["execute", "completion:False"] and finished == [submission]

    seen = Dropping((3, 41))
    submission, _ = make(seen)
    assert submission.attempt() is None
    outcome = submission.future.result(0)
    assert outcome == Outcome(OutcomeKind.ALREADY_APPLIED, 3, 41) and outcome.already_applied and not outcome
    assert seen.calls == ["execute", "completion:False"]


def test_execute_raising_ends_the_context_with_the_exception() -> None:
    context = Recording([KeyError("gone")])
    submission, _ = make(context)
    assert submission.attempt() is None
    with pytest.raises(KeyError):
        submission.future.result(0)
    assert context.calls == ["execute", "exception:KeyError"]


def test_an_outcome_happens_once() -> None:
    context = Recording([True])
    submission, finished = make(context)
    assert submission.attempt() is not None
    submission.complete(1)
    submission.complete(2)
    submission.fail(RuntimeError("late"))
    submission.expire()
    assert submission.attempt() is None  # finished: no more attempts
    assert submission.future.result(0).transaction_id == 1
    assert context.calls == ["execute", "completion:True"]
    assert len(finished) == 1


def test_expiry_is_checked_only_between_attempts() -> None:
    context = Recording([True, True], timeout=0.05)
    submission, finished = make(context)
    assert submission.attempt() is not None
    time.sleep(0.08)
    # The attempt in flight still counts: if the feed shows it committed, it is committed.
    assert submission.expired()
    # It failed instead: the next attempt finds the context expired and does not execute.
    assert submission.attempt() is None
    with pytest.raises(TransactionExpiredError, match="expired after 1 attempt"):
        submission.future.result(0)
    assert context.calls == ["execute", "expiration"]
    assert finished == [submission]


@pytest.mark.parametrize(
    ("data_bytes", "locks", "message"),
    [
        (5000, 0, "5000 bytes"),
        # 3,000 bytes of data fit in 4,096 alone; with 100 lock hashes (up to 10 bytes each) they do not.
        (3000, 100, "3000 bytes and 100 lock"),
    ],
)
def test_data_too_large_ends_the_context(data_bytes: int, locks: int, message: str) -> None:
    class Big(Recording):
        def execute(self, builder: TransactionBuilder) -> bool:
            builder.set_raw_data(b"x" * data_bytes)
            if locks:
                builder.set_write_locks([PartitionLocalLock("many", i) for i in range(locks)])
            return True

    context = Big([])
    submission, _ = make(context, max_bytes=4096)
    assert submission.attempt() is None
    with pytest.raises(MessageTooLargeError, match=message):
        submission.future.result(0)
    assert context.calls == ["exception:MessageTooLargeError"]


def test_the_future_cannot_be_cancelled() -> None:
    submission, _ = make(Recording([True]))
    assert not submission.future.cancel()
    submission.complete(3)
    assert submission.future.result(0).transaction_id == 3


def test_a_failing_callback_does_not_break_the_outcome(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(Recording):
        def on_completion(self, result: bool) -> None:
            raise RuntimeError("application bug")

    submission, finished = make(Broken([True]))
    assert submission.attempt() is not None
    submission.complete(9)
    assert submission.future.result(0).transaction_id == 9
    assert finished == [submission]
    assert "on_completion raised" in caplog.text


def test_retry_pacing() -> None:
    from waltz.client.attempt_runner import _retry_pause

    submission, _ = make(Recording([]))
    # Lock failures naming a new transaction each time (a hot lock) are retried at once: the
    # wait for that transaction is the pacing.
    assert [_retry_pause(submission, target) for target in (10, 11, 12, 13)] == [0.0] * 4
    # The same transaction again and again: the context does not progress; slow it down.
    pauses = [_retry_pause(submission, 13) for _ in range(12)]
    assert pauses[0] == 0.0 and 0 < pauses[1] < pauses[2] and pauses[-1] == 0.5
    # Appends lost with connections: a few at once, then exponentially, up to a second.
    lost = [_retry_pause(submission, None) for _ in range(12)]
    assert lost[:3] == [0.0] * 3 and 0 < lost[3] < lost[4] and lost[-1] == 1.0


def test_a_context_that_sets_its_own_mark_is_not_given_one() -> None:
    class OwnMark(Recording):
        sets_client_high_water_mark = True

    context = OwnMark([True])
    reads: list[int] = []
    submission = Submission(
        context, 0, lambda pid: reads.append(pid) or 5, 1 << 20, on_finished=lambda s: None
    )
    payload = submission.attempt()
    assert reads == []  # get_client_high_water_mark was not called
    assert context.marks == [-1]  # the conservative start; this context never set one
    assert payload is not None and payload.client_high_water_mark == -1


def test_complete_all_frees_every_submission_before_any_future_resolves() -> None:
    order: list[str] = []
    contexts = [Recording([True]) for _ in range(3)]
    submissions = [make(context)[0] for context in contexts]
    for submission in submissions:
        assert submission.attempt() is not None
    submissions[1].fail(RuntimeError("ended before"))  # already ended: left alone
    for i, submission in enumerate(submissions):
        submission.future.add_done_callback(lambda f, i=i: order.append(f"future {i}"))

    def on_finished(ended: list[Submission]) -> None:
        assert not any(s.future.done() for s in ended)
        order.append(f"finished {[submissions.index(s) for s in ended]}")

    fed_at = time.monotonic()
    delay, count = Submission.complete_all(
        [(s, 10 + i) for i, s in enumerate(submissions)], on_finished, fed_at
    )
    assert count == 2 and delay >= 0
    assert order == ["future 1", "finished [0, 2]", "future 0", "future 2"]
    assert [s.future.result(0).transaction_id for s in (submissions[0], submissions[2])] == [10, 12]
    assert contexts[0].calls == ["execute", "completion:True"]
    assert contexts[1].calls == ["execute", "exception:RuntimeError"]
    assert Submission.complete_all([(submissions[0], 99)], on_finished) == (0.0, 0)  # once only
