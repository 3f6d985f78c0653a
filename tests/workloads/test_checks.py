"""The checks of a run that hold for any application: the schema versions the log holds."""

from __future__ import annotations

from collections import Counter

from waltz.workloads.checks import schema_versions_check


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
