"""Fault test: client connections cut at random points while two clients append.

Like upstream's network-fault test: the cut can land anywhere (an append sent and not received, a
commit whose feed entry is lost with the connection, a mount in progress); every client runs the
reconnect procedure (docs/design/client.md "Reconnect") each time. Invariants: every
transaction committed exactly once, both clients apply the same sequence, each context completes
once.
"""

from __future__ import annotations

import pytest

from tests.client.client_helpers import run_with_cuts
from waltz import WaltzClientConfig


def test_random_connection_cuts_during_1000_transactions(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    run_with_cuts(client_config, log_start, per_client=500)


@pytest.mark.slow
def test_random_connection_cuts_during_5000_transactions(
    client_config: WaltzClientConfig, log_start: dict[int, int]
) -> None:
    run_with_cuts(client_config, log_start, per_client=2500)
