"""Server configuration (``server.yaml`` + ``WALTZ_*`` environment variables)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from waltz.config import Port, WaltzSettings
from waltz.errors import MetadataError
from waltz.metadata.values import check_connect_string
from waltz.metadata.zk_security import ZOOKEEPER_SECURITY_KEYS, ZooKeeperSettings
from waltz.protocol.channels import TlsConfig, check_server_tls_files
from waltz.services.exposure import plaintext_refusal
from waltz.services.server.appends import (
    DEFAULT_MAX_LOCK_HASHES_PER_APPEND,
    DEFAULT_MAX_LOCK_HASHES_PER_MESSAGE,
    LockHashLimits,
)
from waltz.services.server.server_partition import PartitionConfig
from waltz.services.server.store.config import StoreConfig

__all__ = ["ServerConfig"]

#: Hosts that bind every address of the machine: no client can connect to them.
WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")

#: The most slots a partition's lock table may have (128 MiB per partition): a larger setting was
#: allocated whole when a partition opened, and failed there with MemoryError.
MAX_LOCK_TABLE_SIZE = 1 << 24

#: The most slots per lock: every slot is read for each lock of each append, on the event loop.
MAX_LOCK_TABLE_HASH_COUNT = 16


class ServerConfig(WaltzSettings, ZooKeeperSettings):
    """Settings of a server; ``docs/configuration.md`` lists keys and variables."""

    model_config = SettingsConfigDict(env_prefix="WALTZ_", extra="forbid")
    ENV_GROUPS: ClassVar[tuple[str, ...]] = ("WALTZ_SERVER_", "WALTZ_STORE_")

    KEYS: ClassVar[dict[str, str]] = {
        "zookeeper.connectString": "zookeeper_connect_string",
        "zookeeper.sessionTimeout": "zookeeper_session_timeout",
        **ZOOKEEPER_SECURITY_KEYS,
        "cluster.root": "cluster_root",
        "server.name": "server_name",
        "server.host": "server_host",
        "server.port": "server_port",
        "server.metrics.port": "server_metrics_port",
        "server.advertisedEndpoint": "server_advertised_endpoint",
        "server.preferredPartitions": "server_preferred_partitions",
        "server.preferredPartitionsReclaimDelay": "server_preferred_partitions_reclaim_delay",
        "server.ssl.certFile": "server_tls_cert_file",
        "server.ssl.keyFile": "server_tls_key_file",
        "server.ssl.caFile": "server_tls_ca_file",
        "server.insecure": "server_insecure",
        "server.optimisticLockTableSize": "server_lock_table_size",
        "server.optimisticLockTableHashCount": "server_lock_table_hash_count",
        "server.maxLockHashesPerAppend": "server_max_lock_hashes_per_append",
        "server.maxLockHashesPerMessage": "server_max_lock_hashes_per_message",
        "server.feedCacheSize": "server_feed_cache_size",
        "server.transactionDataCacheSize": "server_transaction_data_cache_size",
        "server.transactionDataCacheBytes": "server_transaction_data_cache_bytes",
        "server.maxPendingRecords": "server_max_pending_records",
        "server.maxPendingBytes": "server_max_pending_bytes",
        "server.adminAppends": "server_admin_appends",
        "server.tracing": "server_tracing",
        "storage.maxBatchSize": "store_max_batch_size",
        "storage.maxBatchBytes": "store_max_batch_bytes",
        "storage.maxInFlightBatches": "store_max_in_flight_batches",
        "storage.linger": "store_linger",
        "storage.sharedStreams": "store_shared_streams",
        "storage.checkpointInterval": "store_checkpoint_interval",
        "storage.connectTimeout": "store_connect_timeout",
        "storage.requestTimeout": "store_request_timeout",
        "storage.retryInterval": "store_retry_interval",
        "storage.catchUpPage": "store_catch_up_page",
        "storage.catchUpRate": "store_catch_up_rate",
        "storage.ssl.caFile": "store_tls_ca_file",
        "storage.ssl.certFile": "store_tls_cert_file",
        "storage.ssl.keyFile": "store_tls_key_file",
    }

    zookeeper_connect_string: str = Field(description="ZooKeeper connect string, e.g. 127.0.0.1:2181.")
    zookeeper_session_timeout: float = Field(10.0, gt=0, description="ZooKeeper session timeout in seconds.")
    cluster_root: str = Field(description="The cluster root znode, e.g. /waltz/cluster1.")
    server_name: str | None = Field(
        None,
        min_length=1,
        max_length=100,
        description="A name for this server that stays across its restarts (tools show it); "
        "default: its endpoint.",
    )
    server_host: str = Field("127.0.0.1", description="Address the server port binds to and advertises.")
    server_port: Port = Field(
        55180, ge=0, le=65535, description="Port for clients and tools (0: any free port)."
    )
    server_advertised_endpoint: str | None = Field(
        None,
        description="host:port that clients are told to use (a proxy or NAT in front of the server); "
        "default: server.host and the bound port.",
    )
    server_metrics_port: Port | None = Field(
        None, ge=0, le=65535, description="HTTP port for /metrics and /health."
    )
    server_preferred_partitions: list[int] = Field(
        default_factory=list, description="Partitions this server should own when it can."
    )
    server_preferred_partitions_reclaim_delay: float = Field(
        30.0,
        ge=0,
        description="Seconds a server must have been a live member, without a break, before the cluster "
        "manager gives it back its preferred partitions from another live server, or moves partitions to "
        "it from the most loaded servers when it holds fewer than its share (applied by the elected "
        "cluster manager).",
    )
    server_tls_cert_file: Path | None = Field(None, description="PEM certificate: TLS on the server port.")
    server_tls_key_file: Path | None = Field(None, description="PEM private key of the server certificate.")
    server_tls_ca_file: Path | None = Field(
        None, description="PEM CA bundle: clients must present a certificate."
    )
    server_insecure: bool = Field(
        False,
        description="Serve without mutual TLS, on purpose (refused otherwise, on loopback too: every local "
        "user could delete partitions); logged at every start.",
    )
    server_lock_table_size: int = Field(
        1 << 16,
        gt=0,
        le=MAX_LOCK_TABLE_SIZE,
        description="Slots of each partition's lock table (8 bytes each, allocated when the partition "
        f"opens; at most {MAX_LOCK_TABLE_SIZE:,}).",
    )
    server_lock_table_hash_count: int = Field(
        3,
        gt=0,
        le=MAX_LOCK_TABLE_HASH_COUNT,
        description=f"Lock table slots per lock (at most {MAX_LOCK_TABLE_HASH_COUNT}: each is read for "
        "every lock of every append).",
    )
    server_max_lock_hashes_per_append: int = Field(
        DEFAULT_MAX_LOCK_HASHES_PER_APPEND,
        gt=0,
        description="Lock hashes (WRITE, READ and APPEND together) one append may carry; an append with "
        "more is refused with a ServerError naming its ReqId, before the lock table is touched.",
    )
    server_max_lock_hashes_per_message: int = Field(
        DEFAULT_MAX_LOCK_HASHES_PER_MESSAGE,
        gt=0,
        description="Lock hashes one client message of appends may carry; a message with more is refused "
        "whole (none of its appends is appended).",
    )
    server_feed_cache_size: int = Field(100_000, gt=0, description="Recent feed entries kept per partition.")
    server_transaction_data_cache_size: int = Field(
        10_000, gt=0, description="Recent transactions whose data is kept in memory per partition."
    )
    server_transaction_data_cache_bytes: int = Field(
        64 << 20, ge=0, description="Bytes of recent transaction data kept in memory per partition at most."
    )
    server_max_pending_records: int = Field(
        20_000, gt=0, description="Records queued in a partition's store before appends wait (back pressure)."
    )
    server_max_pending_bytes: int = Field(
        256 << 20,
        gt=0,
        description="Bytes of transaction data queued in a partition's store before appends wait (back "
        "pressure; one append always goes when less is queued).",
    )
    server_admin_appends: bool = Field(
        False,
        description="Serve the admin AppendRecords request: appends with caller-chosen ReqIds and no "
        "lock checks, for tools, tests and benchmarks (off: refused with PERMISSION_DENIED).",
    )
    server_tracing: bool = Field(
        False,
        description="OpenTelemetry spans of traced appends and their store batches, exported over OTLP "
        "(the waltz-py[tracing] extra; OTEL_* variables configure the exporter; docs/tracing.md).",
    )
    store_max_batch_size: int = Field(1000, gt=0, description="Records per append request to storage nodes.")
    store_max_batch_bytes: int = Field(
        4 << 20,
        ge=1 << 16,
        le=16 << 20,
        description="Transaction data bytes per append request to storage nodes (a larger transaction goes "
        "alone); at most 16 MiB, half the storage nodes' default gRPC message limit.",
    )
    store_max_in_flight_batches: int = Field(8, gt=0, description="Append batches in flight per partition.")
    store_linger: float = Field(
        0.005,
        ge=0,
        description="Seconds at most to wait to fill a batch while an earlier batch of the partition awaits "
        "its quorum (group commit; never when every batch sent is committed).",
    )
    store_shared_streams: bool = Field(
        True,
        description="One store session stream per storage node, shared by every partition of the server "
        "(false: a stream per partition and storage node).",
    )
    store_checkpoint_interval: int = Field(
        1_000_000, gt=0, description="Transactions after which a new store session (with recovery) starts."
    )
    store_connect_timeout: float = Field(5.0, gt=0, description="Seconds to wait for a storage open.")
    store_request_timeout: float = Field(15.0, gt=0, description="Seconds to wait for a storage request.")
    store_retry_interval: float = Field(
        0.5, gt=0, description="Seconds between attempts to reach a storage node."
    )
    store_catch_up_page: int = Field(
        500, gt=0, description="Records copied per read and append when catching a replica up."
    )
    store_catch_up_rate: float = Field(
        32 << 20,
        ge=0,
        description="Transaction data bytes per second at most copied to one lagging replica while its "
        "session writes (0: no limit).",
    )
    store_tls_ca_file: Path | None = Field(None, description="PEM CA bundle to verify storage nodes (TLS).")
    store_tls_cert_file: Path | None = Field(None, description="PEM client certificate for storage nodes.")
    store_tls_key_file: Path | None = Field(None, description="PEM private key of the client certificate.")

    @field_validator("server_advertised_endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        """Refuse an advertised endpoint a client cannot connect to: not ``host:port`` with a port
        in 1..65535, or a host that binds every address (docs/configuration.md,
        "Server (`waltz server start`)")."""
        if value is None:
            return None
        try:
            check_connect_string(value)
        except MetadataError:
            raise ValueError(
                f"server.advertisedEndpoint {value!r} is not host:port with a port in 1..65535 "
                "(the address clients connect to, e.g. 10.77.0.11:55180)"
            ) from None
        if value.rpartition(":")[0].strip() in WILDCARD_HOSTS:
            raise ValueError(
                f"server.advertisedEndpoint {value!r} names every address of the host, which no client "
                "can connect to: give the host's own address or name"
            )
        return value

    @model_validator(mode="after")
    def _check(self) -> ServerConfig:
        if (self.server_tls_cert_file is None) != (self.server_tls_key_file is None):
            raise ValueError("server.ssl.certFile and server.ssl.keyFile must be set together")
        if self.server_advertised_endpoint is None and self.server_host.strip() in WILDCARD_HOSTS:
            raise ValueError(
                f"server.host {self.server_host!r} binds every address, and clients would be told to "
                "connect to it, which they cannot: set server.advertisedEndpoint "
                "(WALTZ_SERVER_ADVERTISED_ENDPOINT, --advertised-endpoint) to the host:port clients "
                "reach this server at"
            )
        if (self.store_tls_cert_file is None) != (self.store_tls_key_file is None):
            raise ValueError("storage.ssl.certFile and storage.ssl.keyFile must be set together")
        refusal = plaintext_refusal(
            "server",
            "WALTZ_SERVER_",
            self.server_host,
            mutual_tls=self.mutual_tls,
            insecure=self.server_insecure,
        )
        if refusal is not None:
            raise ValueError(refusal)
        return self

    @property
    def mutual_tls(self) -> bool:
        """Certificate, key and CA file of the server port are all set: every client presents one."""
        return None not in (self.server_tls_cert_file, self.server_tls_key_file, self.server_tls_ca_file)

    def check_tls_files(self) -> None:
        """Check the server's TLS files before anything starts or connects (docs/operations.md,
        "Certificates"): those of its port (``server.ssl.*``) and those it presents to the storage
        nodes (``storage.ssl.*``), each one there, the key the certificate's, the CA file PEM.

        Raises:
            TlsFilesError: which setting, which file, and what is wrong with it.
        """
        check_server_tls_files(
            self.server_tls_cert_file, self.server_tls_key_file, self.server_tls_ca_file, "server.ssl"
        )
        tls = self.store_config().tls
        if tls is not None:
            tls.check_files(("storage.ssl", "WALTZ_STORE_TLS"))

    def presented_certificates(self) -> dict[str, Path | None]:
        """The certificates the server presents, by the name its expiry gauge gives each
        (docs/operations.md, "Certificates"): to its clients (``server``), to the storage nodes
        (``storage client``) and to ZooKeeper (``zookeeper client``); None where there is none."""
        return {
            "server": self.server_tls_cert_file,
            "storage client": self.store_tls_cert_file,
            "zookeeper client": self.zookeeper_ssl_cert_file,
        }

    def partition_config(self) -> PartitionConfig:
        """The partition object settings derived from the ``server.*`` keys."""
        return PartitionConfig(
            lock_table_size=self.server_lock_table_size,
            lock_table_hash_count=self.server_lock_table_hash_count,
            feed_cache_size=self.server_feed_cache_size,
            transaction_data_cache_size=self.server_transaction_data_cache_size,
            transaction_data_cache_bytes=self.server_transaction_data_cache_bytes,
            max_pending=self.server_max_pending_records,
            max_pending_bytes=self.server_max_pending_bytes,
        )

    def lock_hash_limits(self) -> LockHashLimits:
        """The most lock hashes per append and per message (``server.maxLockHashesPer*``)."""
        return LockHashLimits(self.server_max_lock_hashes_per_append, self.server_max_lock_hashes_per_message)

    def store_config(self) -> StoreConfig:
        """The store settings derived from the ``storage.*`` keys."""
        tls = None
        if self.store_tls_ca_file or self.store_tls_cert_file:
            tls = TlsConfig(self.store_tls_ca_file, self.store_tls_cert_file, self.store_tls_key_file)
        return StoreConfig(
            max_batch_records=self.store_max_batch_size,
            max_batch_bytes=self.store_max_batch_bytes,
            max_in_flight_batches=self.store_max_in_flight_batches,
            linger=self.store_linger,
            checkpoint_interval=self.store_checkpoint_interval,
            connect_timeout=self.store_connect_timeout,
            request_timeout=self.store_request_timeout,
            retry_interval=self.store_retry_interval,
            catch_up_page=self.store_catch_up_page,
            catch_up_rate=self.store_catch_up_rate,
            tls=tls,
        )
