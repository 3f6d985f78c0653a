"""Reading a log up to known marks with a client of its own (checks, tools, tests).

Source: docs/design/client.md "Applying transactions" (a client applies every committed transaction
of the partitions it mounts, in order). The demo's and ``waltz chaos``'s checks read the whole log
back from the start with a fresh client to compare it with what the applications applied.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from waltz.client.callbacks import WaltzClientCallbacks
from waltz.client.client import WaltzClient
from waltz.client.config import WaltzClientConfig

__all__ = ["PROGRESS_INTERVAL", "READ_APPLY_BATCH", "read_up_to"]

#: Transactions per apply batch of a reading client (for callbacks that apply in batches).
READ_APPLY_BATCH = 500
#: Seconds between two progress reports of a long read.
PROGRESS_INTERVAL = 30.0


def read_up_to(
    callbacks: WaltzClientCallbacks,
    config: WaltzClientConfig,
    marks: Mapping[int, int],
    *,
    timeout: float,
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """Apply every partition into ``callbacks`` up to ``marks`` with a new client, then close it.

    The client mounts every partition from the callbacks' high-water marks (-1 for a fresh reader)
    and returns once each partition is applied up to its mark.

    Args:
        callbacks: what the transactions are applied to.
        config: the client settings that reach the cluster (connect string, root, ZooKeeper
            credential, TLS); the reader applies in batches of :data:`READ_APPLY_BATCH` whatever
            it says.
        marks: partition -> the committed high-water mark to read up to (-1: nothing).
        timeout: seconds allowed per partition.
        progress: called every :data:`PROGRESS_INTERVAL` seconds while the read goes on, with
            ``(transactions applied, transactions to apply)`` over every partition (as the
            callbacks' high-water marks count them).

    Raises:
        TimeoutError: a partition was not applied up to its mark in time (the message says how far).
        WaltzError: the client could not start (ZooKeeper, the cluster).
    """
    config = config.model_copy(update={"client_max_apply_batch_size": READ_APPLY_BATCH})
    targets = {pid: mark for pid, mark in sorted(marks.items()) if mark >= 0}
    total = sum(mark + 1 for mark in targets.values())

    def applied() -> int:
        return sum(min(callbacks.get_client_high_water_mark(p), m) + 1 for p, m in targets.items())

    with WaltzClient(callbacks, config) as client:
        for pid, mark in targets.items():
            deadline = time.monotonic() + timeout
            while not client.wait_applied(
                pid, mark, max(0.0, min(PROGRESS_INTERVAL, deadline - time.monotonic()))
            ):
                if time.monotonic() >= deadline:
                    got = callbacks.get_client_high_water_mark(pid)
                    raise TimeoutError(
                        f"the log reader read partition {pid} up to {got}, not {mark}, in {timeout:g}s"
                    )
                if progress is not None:
                    progress(applied(), total)
