"""Settings of the replicated store (the ``storage.*`` keys of a server's configuration)."""

from __future__ import annotations

from dataclasses import dataclass

from waltz.protocol.channels import TlsConfig

__all__ = ["StoreConfig"]


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """How a server's store partitions talk to storage nodes.

    Attributes:
        max_batch_records: records sent to the replicas in one append request at most
            (``storage.maxBatchSize``).
        max_batch_bytes: transaction data bytes in one append request at most
            (``storage.maxBatchBytes``); a larger transaction goes alone.
        max_in_flight_batches: append batches sent and not yet committed, per partition.
        linger: seconds at most that a batch smaller than the maximum waits for more records while
            an earlier batch of the partition awaits its quorum (``storage.linger``; 0: send at
            once). The wait ends when that batch commits: appends that arrive during a store round
            trip go together (group commit; several clients' appends share one flush) rather than
            one small batch per client message, a lone append never waits, and a slow replica
            (beyond the quorum) holds nothing back. Why the quorum and 5 ms:
            docs/decisions/0008-linger-while-awaiting-quorum.md.
        checkpoint_interval: transactions after which a new store session is started, so that a
            recovery never has to look back far (``storage.checkpointInterval``,
            docs/design/server.md "Store sessions").
        connect_timeout: seconds to wait for a storage node to answer an open request.
        request_timeout: seconds to wait for any other storage request.
        retry_interval: seconds between attempts to reach storage nodes that are down.
        catch_up_page: records copied per read and append when catching a replica up
            (``storage.catchUpPage``, docs/design/recovery.md "Catching up in the background").
        catch_up_rate: transaction data bytes per second at most that one lagging replica is
            copied at while its session writes (``storage.catchUpRate``; 0: no limit).
        catch_up_lag_window: seconds over which a background catch-up compares its lag: a lag
            that grew over a window is logged at WARNING, at most once a window
            (docs/design/recovery.md "Catching up in the background"; no configuration key).
        tls: client TLS files for storage connections, or None for plaintext.
    """

    max_batch_records: int = 1000
    max_batch_bytes: int = 4 << 20
    max_in_flight_batches: int = 8
    linger: float = 0.005
    checkpoint_interval: int = 1_000_000
    connect_timeout: float = 5.0
    request_timeout: float = 15.0
    retry_interval: float = 0.5
    catch_up_page: int = 500
    catch_up_rate: float = 32 << 20
    catch_up_lag_window: float = 30.0
    tls: TlsConfig | None = None
