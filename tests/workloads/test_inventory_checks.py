"""The checks of an inventory run fail on the states they exist to catch (``waltz.workloads.inventory``)."""

from __future__ import annotations

import pytest

from waltz.errors import ConfigurationError
from waltz.workloads.inventory import (
    DEFAULT_INVENTORY_APPLICATION,
    InventoryApplication,
    InventoryState,
    inventory_checks,
    load_inventory_application,
    replay_check,
)

SOUND = InventoryState(
    skus={0: (10, 10), 1: (10, 4)},
    reserved_by_sku={0: 10, 1: 4},
    reservations=6,
    digest="abc",
)


def failed(state: InventoryState, first_commits: int | None = None) -> list[str]:
    return [c.name for c in inventory_checks(state, first_commits) if not c.passed]


def test_a_sound_state_passes_every_check() -> None:
    checks = inventory_checks(SOUND, first_commits=6)
    assert [c.passed for c in checks] == [True] * 4, checks
    assert "0: 10/10, 1: 4/10" in checks[0].detail


def test_an_oversold_sku_fails_the_oversell_check_naming_it() -> None:
    oversold = InventoryState(skus={0: (10, 11), 1: (10, 4)}, reserved_by_sku={0: 11, 1: 4}, reservations=7)
    assert failed(oversold) == ["no SKU oversold (reserved <= stock)"]
    assert "oversold: {0: '11 of 10'}" in inventory_checks(oversold)[0].detail


def test_reserved_that_differs_from_the_reservations_fails() -> None:
    drifted = InventoryState(skus={0: (10, 9)}, reserved_by_sku={0: 10}, reservations=5)
    assert failed(drifted) == ["each SKU's reserved = the sum of its reservations"]
    orphaned = InventoryState(skus={0: (10, 2)}, reserved_by_sku={0: 2, 5: 1}, reservations=2)
    assert failed(orphaned) == ["each SKU's reserved = the sum of its reservations"]


def test_a_key_applied_twice_fails_and_so_does_a_retry_that_left_a_reservation() -> None:
    twice = InventoryState(
        skus={0: (10, 4)}, reserved_by_sku={0: 4}, reservations=2, repeated_keys={"i0-3": 2}
    )
    assert failed(twice, first_commits=1) == [
        "each idempotency key applied at most once",
        "one reservation per request committed (retries left none)",
    ]


def test_a_replay_that_differs_fails() -> None:
    assert replay_check(SOUND, SOUND).passed
    other = InventoryState(
        skus=SOUND.skus, reserved_by_sku=SOUND.reserved_by_sku, reservations=6, digest="abd"
    )
    assert not replay_check(SOUND, other).passed


def test_the_default_application_is_the_inventory_example() -> None:
    app = load_inventory_application(DEFAULT_INVENTORY_APPLICATION)
    assert isinstance(app, InventoryApplication)
    assert app.name == "inventory"
    assert app.tables == {"inventory_skus", "inventory_reservations"}
    with pytest.raises(ConfigurationError, match=r"neither waltz_examples\.ledger\.service nor"):
        load_inventory_application("waltz_examples.ledger")
