"""Storage node configuration (``storage.yaml`` + ``WALTZ_STORAGE_*`` environment variables)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from waltz.config import Port, WaltzSettings
from waltz.protocol.channels import (
    DEFAULT_MAX_MESSAGE_BYTES,
    check_server_tls_files,
)
from waltz.services.exposure import plaintext_refusal
from waltz.services.storage.node import DEFAULT_INLINE_APPEND_STREAMS
from waltz.services.storage.retention import (
    DEFAULT_CHECK_INTERVAL,
    DEFAULT_KEEP_SECONDS,
    RetentionPolicy,
    RetentionSettings,
)
from waltz.services.storage.storage_partition import DEFAULT_MAX_FENCE_JUMP

__all__ = ["StorageConfig"]


class StorageConfig(WaltzSettings):
    """Settings of a storage node; ``docs/configuration.md`` lists keys and variables."""

    model_config = SettingsConfigDict(env_prefix="WALTZ_STORAGE_", extra="forbid")
    ENV_GROUPS: ClassVar[tuple[str, ...]] = ("WALTZ_STORAGE_",)

    KEYS: ClassVar[dict[str, str]] = {
        "storage.directory": "directory",
        "storage.host": "host",
        "storage.port": "port",
        "storage.admin.port": "admin_port",
        "storage.metrics.port": "metrics_port",
        "storage.segment.size.threshold": "segment_size_threshold",
        "storage.index.checkpointInterval": "checkpoint_interval",
        "storage.grpc.maxMessageBytes": "max_message_bytes",
        "storage.maxResponseBytes": "max_response_bytes",
        "storage.inlineAppends": "inline_appends",
        "storage.inlineAppendStreams": "inline_append_streams",
        "storage.fence.maxJump": "fence_max_jump",
        "storage.retention.policy": "retention_policy",
        "storage.retention.keepSeconds": "retention_keep_seconds",
        "storage.retention.keepSegments": "retention_keep_segments",
        "storage.retention.keepBytes": "retention_keep_bytes",
        "storage.retention.checkInterval": "retention_check_interval",
        "storage.ssl.certFile": "tls_cert_file",
        "storage.ssl.keyFile": "tls_key_file",
        "storage.ssl.caFile": "tls_ca_file",
        "storage.insecure": "insecure",
    }

    directory: Path = Field(description="The storage directory (control file and partition directories).")
    host: str = Field("127.0.0.1", description="Address the storage and admin ports bind to.")
    port: Port = Field(55280, ge=0, le=65535, description="Port of the storage protocol (store sessions).")
    admin_port: Port = Field(55281, ge=0, le=65535, description="Port of the admin protocol.")
    metrics_port: Port | None = Field(
        None, ge=0, le=65535, description="HTTP port serving /metrics and /health; none when unset."
    )
    segment_size_threshold: int = Field(
        1 << 30, gt=0, description="Bytes of a segment data file after which a new segment starts."
    )
    checkpoint_interval: int = Field(1000, gt=0, description="Transactions between index file flushes.")
    max_message_bytes: int = Field(
        DEFAULT_MAX_MESSAGE_BYTES,
        ge=DEFAULT_MAX_MESSAGE_BYTES,
        description="Largest gRPC message accepted or sent, in bytes; at least 32 MiB, the largest "
        "transaction a client may send (a node that refused one would stop its partitions' writes).",
    )
    max_response_bytes: int = Field(
        4 << 20, ge=1 << 10, description="Size budget of one record list response, in bytes."
    )
    inline_appends: bool = Field(
        True,
        description="Write and fsync an append on the event loop, not the partition's I/O thread, "
        "while at most storage.inlineAppendStreams store session streams append on this node "
        "(saves two thread switches per batch; off: always the I/O thread).",
    )
    inline_append_streams: int = Field(
        DEFAULT_INLINE_APPEND_STREAMS,
        ge=1,
        description="Store session streams (one per server writing here) whose appends may run on "
        "the event loop at once; with more appending, appends go to the partitions' I/O threads, "
        "which flush in parallel.",
    )
    fence_max_jump: int = Field(
        DEFAULT_MAX_FENCE_JUMP,
        ge=1,
        description="The largest raise of a partition's fence (the highest store session ID it has "
        "seen) that one request may make; a request further above is refused and the fence stays. "
        "Store session IDs grow by one per session, so only a forged or corrupt ID jumps that far.",
    )
    retention_policy: RetentionPolicy = Field(
        RetentionPolicy.NEVER,
        description="What the node deletes: never (nothing), or archived (sealed segments whose every "
        "transaction the archiver says is archived, past the keep settings).",
    )
    retention_keep_seconds: float = Field(
        DEFAULT_KEEP_SECONDS,
        ge=0,
        description="Seconds since a segment was sealed before retention may delete it.",
    )
    retention_keep_segments: int = Field(
        0, ge=0, description="Newer segments that must remain after a segment retention deletes."
    )
    retention_keep_bytes: int = Field(
        0, ge=0, description="Bytes of newer segments that must remain after a segment retention deletes."
    )
    retention_check_interval: float = Field(
        DEFAULT_CHECK_INTERVAL, gt=0, description="Seconds between two retention checks of every partition."
    )
    tls_cert_file: Path | None = Field(None, description="PEM certificate chain; TLS on both ports when set.")
    tls_key_file: Path | None = Field(None, description="PEM private key of the certificate.")
    tls_ca_file: Path | None = Field(
        None, description="PEM CA bundle; when set, clients must present a certificate."
    )
    insecure: bool = Field(
        False,
        description="Serve without mutual TLS, on purpose (refused otherwise, on loopback too: every local "
        "user could delete partitions); logged at every start.",
    )

    def retention(self) -> RetentionSettings:
        """The retention settings (docs/design/archive.md, "Retention on the storage nodes")."""
        return RetentionSettings(
            self.retention_policy,
            self.retention_keep_seconds,
            self.retention_keep_segments,
            self.retention_keep_bytes,
            self.retention_check_interval,
        )

    @model_validator(mode="after")
    def _check(self) -> StorageConfig:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("storage.ssl.certFile and storage.ssl.keyFile must be set together")
        if self.max_response_bytes > self.max_message_bytes // 2:
            raise ValueError("storage.maxResponseBytes must be at most half of storage.grpc.maxMessageBytes")
        refusal = plaintext_refusal(
            "storage", "WALTZ_STORAGE_", self.host, mutual_tls=self.mutual_tls, insecure=self.insecure
        )
        if refusal is not None:
            raise ValueError(refusal)
        return self

    @property
    def mutual_tls(self) -> bool:
        """Certificate, key and CA file are all set: every peer presents a certificate."""
        return None not in (self.tls_cert_file, self.tls_key_file, self.tls_ca_file)

    def check_tls_files(self) -> None:
        """Check the ``storage.ssl.*`` files before anything starts (docs/operations.md,
        "Certificates"): each one there, the key the certificate's, the CA file a PEM bundle.

        Raises:
            TlsFilesError: which setting, which file, and what is wrong with it.
        """
        check_server_tls_files(self.tls_cert_file, self.tls_key_file, self.tls_ca_file, "storage.ssl")
