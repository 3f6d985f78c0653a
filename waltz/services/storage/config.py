"""Storage node configuration (``storage.yaml`` + ``WALTZ_STORAGE_*`` environment variables)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from waltz.config import WaltzSettings
from waltz.protocol.channels import DEFAULT_MAX_MESSAGE_BYTES
from waltz.services.storage.node import DEFAULT_INLINE_APPEND_STREAMS
from waltz.services.storage.storage_partition import DEFAULT_MAX_FENCE_JUMP

__all__ = ["StorageConfig"]


class StorageConfig(WaltzSettings):
    """Settings of a storage node; ``docs/configuration.md`` lists keys and variables."""

    model_config = SettingsConfigDict(env_prefix="WALTZ_STORAGE_", extra="forbid")

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
        "storage.ssl.certFile": "tls_cert_file",
        "storage.ssl.keyFile": "tls_key_file",
        "storage.ssl.caFile": "tls_ca_file",
    }

    directory: Path = Field(description="The storage directory (control file and partition directories).")
    host: str = Field("127.0.0.1", description="Address the storage and admin ports bind to.")
    port: int = Field(55280, ge=0, le=65535, description="Port of the storage protocol (store sessions).")
    admin_port: int = Field(55281, ge=0, le=65535, description="Port of the admin protocol.")
    metrics_port: int | None = Field(
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
    tls_cert_file: Path | None = Field(None, description="PEM certificate chain; TLS on both ports when set.")
    tls_key_file: Path | None = Field(None, description="PEM private key of the certificate.")
    tls_ca_file: Path | None = Field(
        None, description="PEM CA bundle; when set, clients must present a certificate."
    )

    @model_validator(mode="after")
    def _check(self) -> StorageConfig:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("storage.ssl.certFile and storage.ssl.keyFile must be set together")
        if self.max_response_bytes > self.max_message_bytes // 2:
            raise ValueError("storage.maxResponseBytes must be at most half of storage.grpc.maxMessageBytes")
        return self
