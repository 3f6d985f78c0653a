"""NetworkLab hosts with chosen addresses: given ones are used, bad ones refused before anything is built."""

from __future__ import annotations

import pytest

from waltz.errors import ConfigurationError
from waltz.local.netns import NetworkLab, network_lab_unavailable


@pytest.fixture(autouse=True)
def _root() -> None:
    reason = network_lab_unavailable()
    if reason is not None:
        pytest.skip(reason)


def test_chosen_addresses_are_used_and_the_others_follow_the_order() -> None:
    lab = NetworkLab(["a", "b", "c"], subnet="10.77.0.0/24", addresses={"a": "10.77.0.11", "c": "10.77.0.13"})
    assert [lab.address(name) for name in ("a", "b", "c")] == ["10.77.0.11", "10.77.0.3", "10.77.0.13"]


@pytest.mark.parametrize(
    ("addresses", "message"),
    [
        ({"a": "10.78.0.5"}, "must be a host address of 10.77.0.0/24"),
        ({"a": "10.77.0.1"}, "other than the bridge's 10.77.0.1"),
        ({"a": "10.77.0.255"}, "must be a host address"),
        ({"x": "10.77.0.5"}, "not in the lab: \\['x'\\]"),
        ({"a": "10.77.0.3"}, "two hosts would share an address"),  # b's own address
    ],
)
def test_bad_chosen_addresses_are_refused(addresses: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        NetworkLab(["a", "b"], subnet="10.77.0.0/24", addresses=addresses)
