"""Reading a log up to known marks with a client of its own (checks, tools, tests).

Source: seed 000, "Client-Application Interactions" (a client applies every committed transaction
of the partitions it mounts, in order). The demo's and ``waltz chaos``'s checks read the whole log
back from the start with a fresh client to compare it with what the applications applied.
"""

from __future__ import annotations

from collections.abc import Mapping

from waltz.client.callbacks import WaltzClientCallbacks
from waltz.client.client import WaltzClient
from waltz.client.config import WaltzClientConfig

__all__ = ["READ_APPLY_BATCH", "read_up_to"]

#: Transactions per apply batch of a reading client (for callbacks that apply in batches).
READ_APPLY_BATCH = 500


def read_up_to(
    callbacks: WaltzClientCallbacks,
    zookeeper: str,
    cluster_root: str,
    marks: Mapping[int, int],
    *,
    timeout: float,
) -> None:
    """Apply every partition into ``callbacks`` up to ``marks`` with a new client, then close it.

    The client mounts every partition from the callbacks' high-water marks (-1 for a fresh reader)
    and returns once each partition is applied up to its mark.

    Args:
        callbacks: what the transactions are applied to.
        zookeeper: ZooKeeper connect string.
        cluster_root: the cluster root znode.
        marks: partition -> the committed high-water mark to read up to (-1: nothing).
        timeout: seconds allowed per partition.

    Raises:
        TimeoutError: a partition was not applied up to its mark in time (the message says how far).
        WaltzError: the client could not start (ZooKeeper, the cluster).
    """
    config = WaltzClientConfig(
        zookeeper_connect_string=zookeeper,
        cluster_root=cluster_root,
        client_max_apply_batch_size=READ_APPLY_BATCH,
    )
    with WaltzClient(callbacks, config) as client:
        for pid, mark in sorted(marks.items()):
            if mark >= 0 and not client.wait_applied(pid, mark, timeout):
                got = callbacks.get_client_high_water_mark(pid)
                raise TimeoutError(
                    f"the log reader read partition {pid} up to {got}, not {mark}, in {timeout:g}s"
                )
