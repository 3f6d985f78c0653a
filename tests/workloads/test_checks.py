"""The checks of a run that hold for any application: each (transaction, member) applied once,
the schema versions the log holds."""

from __future__ import annotations

from collections import Counter

from waltz.workloads.checks import applied_once_check, schema_versions_check

#: Partition 0 holds transactions 0..3, transaction 2 a batch of three members.
MARKS = {0: 3}
MEMBERS = {0: {2: (0, 1, 2)}}
ONCE = [(0, 0), (1, 0), (2, 0), (2, 1), (2, 2), (3, 0)]


def test_each_member_of_a_batch_applied_once_passes_and_counts_them() -> None:
    check = applied_once_check(MARKS, {0: ONCE}, MEMBERS)
    assert check.passed, check.detail
    assert check.name == "every (transaction, member) applied exactly once"
    assert check.detail == "4 transactions, 6 change-sets (1 batches)"


def test_a_member_applied_twice_or_never_fails_naming_it() -> None:
    twice = applied_once_check(MARKS, {0: [*ONCE, (2, 3)]}, MEMBERS)
    assert not twice.passed
    assert twice.detail == "partition 0: missing [] (0), extra [(2, 3)] (1)"
    never = applied_once_check(MARKS, {0: [r for r in ONCE if r != (2, 1)]}, MEMBERS)
    assert not never.passed
    assert never.detail == "partition 0: missing [(2, 1)] (1), extra [] (0)"


def test_a_member_skipped_for_its_repeated_key_is_not_expected() -> None:
    check = applied_once_check(MARKS, {0: [r for r in ONCE if r != (2, 1)]}, {0: {2: (0, 2)}})
    assert check.passed, check.detail


def test_an_application_recording_transaction_ids_is_checked_by_transaction() -> None:
    assert applied_once_check(MARKS, {0: [0, 1, 2, 3]}, MEMBERS).passed
    assert not applied_once_check(MARKS, {0: [0, 1, 2, 2, 3]}, MEMBERS).passed


def test_a_log_holding_every_version_of_each_model_passes_and_lists_them() -> None:
    check = schema_versions_check(
        {"account": 3, "savings": 1}, {"account": Counter({1: 40, 2: 5, 3: 4}), "savings": Counter({1: 9})}
    )
    assert check.passed
    assert check.detail == "account v1 40, v2 5, v3 4; savings v1 9"


def test_a_missing_version_fails_naming_the_entity() -> None:
    check = schema_versions_check({"account": 3}, {"account": Counter({1: 40, 3: 4})})
    assert not check.passed
    assert check.detail.startswith("account is version 3, the log holds [1, 3]")


def test_a_version_newer_than_the_model_fails() -> None:
    check = schema_versions_check({"account": 2}, {"account": Counter({1: 1, 2: 1, 3: 1})})
    assert not check.passed


def test_an_entity_without_a_model_fails() -> None:
    check = schema_versions_check({"account": 1}, {"account": Counter({1: 1}), "other": Counter({1: 1})})
    assert not check.passed
    assert "entities without a model: ['other']" in check.detail
