"""Client configuration (``client.yaml`` + ``WALTZ_*`` environment variables).

Keys are Waltz's dotted names, written flat or nested in a YAML file and loaded with
:func:`waltz.config.load_settings`::

    config = load_settings(WaltzClientConfig, Path("client.yaml"))
    config = WaltzClientConfig(zookeeper_connect_string="127.0.0.1:2181", cluster_root="/waltz/c1")

Each key's environment variable is ``WALTZ_`` plus the field name in upper case, e.g.
``client.maxConcurrentTransactions`` is ``WALTZ_CLIENT_MAX_CONCURRENT_TRANSACTIONS``.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from waltz.config import WaltzSettings
from waltz.errors import ConfigurationError
from waltz.metadata.zk_security import ZOOKEEPER_SECURITY_KEYS, ZooKeeperSecurity, ZooKeeperSettings
from waltz.protocol.certificates import refuse_expired_certificates, refuse_unreadable_tls_files
from waltz.protocol.channels import CLIENT_TLS_SETTINGS, DEFAULT_MAX_MESSAGE_BYTES, TlsConfig

__all__ = ["CERTIFICATE_PEERS", "MAX_TIMEOUT_SECONDS", "WaltzClientConfig"]

#: The longest timeout of the client's settings, in seconds: a day. Larger values overflow the
#: waits they bound (a thread's wait takes at most ``threading.TIMEOUT_MAX``); no wait of the
#: client is meant to last that long.
MAX_TIMEOUT_SECONDS = 86_400.0

#: Who refuses a client's expired certificate, for the message that says so.
CERTIFICATE_PEERS = "the servers and ZooKeeper"


class WaltzClientConfig(WaltzSettings, ZooKeeperSettings):
    """Settings of a :class:`~waltz.client.client.WaltzClient`.

    See docs/design/client.md "WaltzClient and AsyncWaltzClient". Keys (and fields):

    - ``zookeeper.connectString`` (``zookeeper_connect_string``): ZooKeeper connect string.
    - ``zookeeper.sessionTimeout`` (``zookeeper_session_timeout``): seconds.
    - ``cluster.root`` (``cluster_root``): the cluster root znode.
    - ``client.autoMount`` (``client_auto_mount``): mount every partition at start; when off, the
      application chooses partitions with ``set_partitions``.
    - ``client.maxConcurrentTransactions`` (``client_max_concurrent_transactions``): contexts in
      flight per partition; ``submit`` blocks at the limit (docs/design/client.md "Back pressure").
    - ``client.longWaitThreshold`` (``client_long_wait_threshold``): seconds a blocked ``submit``
      or ``flush`` waits before nudging the server with a flush request, and a first attempt of
      ``AsyncWaltzClient`` waits for a retry thread held by one long attempt, or the completion
      thread runs one batch of completions, before the client warns of it.
    - ``client.numTransactionRetryThreads`` (``client_num_transaction_retry_threads``): threads
      that re-execute failed contexts and run the contexts' callbacks.
    - ``client.maxApplyBatchSize`` (``client_max_apply_batch_size``): transactions handed at once
      to ``apply_transactions`` when the callbacks implement that hook.
    - ``client.applyLinger`` (``client_apply_linger``): seconds the apply worker waits for more
      transactions when fewer than ``client.maxApplyBatchSize`` are ready (group apply; 0: hand
      over what is there at once).
    - ``client.maxApplyBacklog`` (``client_max_apply_backlog``): the feed window per partition:
      the server feeds at most this many transactions beyond what the application applied, and
      the client grants more as it applies (``docs/protocol.md`` "Feed window"), so memory stays
      bounded when the application applies more slowly than the log grows; 0: no limit.
    - ``client.holdConflictingAppends`` (``client_hold_conflicting_appends``): hold back an
      append whose lock a pending append of this client holds (it would fail if that one
      commits; ``docs/protocol.md`` "Append"), instead of sending it for the server to refuse.
    - ``client.retryLinger`` (``client_retry_linger``): seconds the append of a re-attempt (after
      a lock failure or a lost append) may wait for a first attempt's append to share its stream
      message, when nothing else is being sent (``docs/protocol.md`` "Append"); 0: sent at once.
    - ``client.batchLinger`` (``client_batch_linger``): seconds at least between two log
      transactions of one partition sent by an
      :class:`~waltz.jdbc_style.entity_batches.EntityBatcher`: a batch that finds the partition's
      last one sent less than this ago waits out the rest, and what is submitted meanwhile joins
      it (once that has passed, until a linger from that one's end while fewer than a third of its
      members' count are queued); a batch that cannot grow (full, or with a context that has a
      timeout queued behind it) goes at once, and nothing waits while the partition's contexts
      come less often than three per linger (docs/design/sql.md "Batched entity transactions");
      0: no wait.
      15 ms by default (docs/decisions/0083-a-linger-between-a-partition-s-batches.md, and
      docs/decisions/0090-a-batch-linger-of-15-ms.md for the default).
    - ``client.batchMaxInFlightAlone`` (``client_batch_max_in_flight_alone``): contexts an
      ``EntityBatcher`` sends at once, alone, beyond its log transactions in flight per partition
      (nothing queued, no expected lock held in flight; with a linger, only while the partition's
      contexts come less often than three per linger); 0: every one waits for the next batch.
    - ``client.transactionDataTimeout`` (``client_transaction_data_timeout``): seconds a
      ``Transaction.get_data`` keeps retrying.
    - ``client.readYourWritesTimeout`` (``client_read_your_writes_timeout``): seconds a new
      attempt waits for this client's own committed transactions of the partition to be applied
      before it executes (so that a read-modify-write sees its previous write). This and the
      other timeouts (``zookeeper.sessionTimeout``, ``client.longWaitThreshold``,
      ``client.transactionDataTimeout``) are at most :data:`MAX_TIMEOUT_SECONDS`, a day.
    - ``client.maxMessageBytes`` (``client_max_message_bytes``): gRPC message size limit.
    - ``client.tracing`` (``client_tracing``): OpenTelemetry traces of this client's transactions
      (docs/tracing.md; needs the ``waltz-py[tracing]`` extra).
    - ``client.tracingSampleRatio`` (``client_tracing_sample_ratio``): the share of transactions
      traced when tracing is on.
    - ``client.ssl.caFile`` / ``certFile`` / ``keyFile``: TLS to servers (CA to verify them;
      certificate and key for mutual TLS).
    - ``zookeeper.auth.digestFile`` / ``zookeeper.auth.digest`` / ``zookeeper.ssl.*``: the
      cluster's ZooKeeper credential and TLS (:class:`~waltz.metadata.zk_security.ZooKeeperSettings`).
    """

    model_config = SettingsConfigDict(env_prefix="WALTZ_", extra="forbid")
    ENV_GROUPS: ClassVar[tuple[str, ...]] = ("WALTZ_CLIENT_",)

    KEYS: ClassVar[dict[str, str]] = {
        "zookeeper.connectString": "zookeeper_connect_string",
        "zookeeper.sessionTimeout": "zookeeper_session_timeout",
        **ZOOKEEPER_SECURITY_KEYS,
        "cluster.root": "cluster_root",
        "client.autoMount": "client_auto_mount",
        "client.maxConcurrentTransactions": "client_max_concurrent_transactions",
        "client.longWaitThreshold": "client_long_wait_threshold",
        "client.numTransactionRetryThreads": "client_num_transaction_retry_threads",
        "client.maxApplyBatchSize": "client_max_apply_batch_size",
        "client.applyLinger": "client_apply_linger",
        "client.maxApplyBacklog": "client_max_apply_backlog",
        "client.holdConflictingAppends": "client_hold_conflicting_appends",
        "client.retryLinger": "client_retry_linger",
        "client.batchLinger": "client_batch_linger",
        "client.batchMaxInFlightAlone": "client_batch_max_in_flight_alone",
        "client.transactionDataTimeout": "client_transaction_data_timeout",
        "client.readYourWritesTimeout": "client_read_your_writes_timeout",
        "client.maxMessageBytes": "client_max_message_bytes",
        "client.tracing": "client_tracing",
        "client.tracingSampleRatio": "client_tracing_sample_ratio",
        "client.ssl.caFile": "client_tls_ca_file",
        "client.ssl.certFile": "client_tls_cert_file",
        "client.ssl.keyFile": "client_tls_key_file",
    }

    zookeeper_connect_string: str = Field(description="ZooKeeper connect string, e.g. 127.0.0.1:2181.")
    zookeeper_session_timeout: float = Field(
        default=10.0,
        gt=0,
        le=MAX_TIMEOUT_SECONDS,
        description="ZooKeeper session timeout in seconds (at most a day).",
    )
    cluster_root: str = Field(description="The cluster root znode, e.g. /waltz/cluster1.")
    client_auto_mount: bool = Field(default=True, description="Mount every partition at start.")
    client_max_concurrent_transactions: int = Field(
        default=4000,
        gt=0,
        description="Transaction contexts in flight per partition; submit blocks at the limit.",
    )
    client_long_wait_threshold: float = Field(
        default=1.0,
        gt=0,
        le=MAX_TIMEOUT_SECONDS,
        description="Seconds of blocking after which the client nudges the server with a flush "
        "(at most a day).",
    )
    client_num_transaction_retry_threads: int = Field(
        default=2,
        gt=0,
        description="Threads that re-execute failed contexts and run their callbacks (completions of "
        "committed transactions run on a thread of their own).",
    )
    client_max_apply_batch_size: int = Field(
        default=100,
        gt=0,
        description="Transactions per apply_transactions call (when the callbacks have it).",
    )
    client_apply_linger: float = Field(
        default=0.0,
        ge=0,
        le=10,
        description="Seconds the apply worker waits to fill a group apply batch (0: no wait).",
    )
    client_max_apply_backlog: int = Field(
        default=10_000,
        ge=0,
        description="Feed window: transactions fed beyond what the application applied, at most (0: none).",
    )
    client_hold_conflicting_appends: bool = Field(
        default=True,
        description="Hold back an append whose lock a pending append of this client holds, until that "
        "one commits (then a lock failure, without a round trip to the server) or fails (then sent).",
    )
    client_retry_linger: float = Field(
        default=0.003,
        ge=0,
        le=1,
        description="Seconds a re-attempt's append may wait to share the stream message of the next "
        "first attempt's append (0: sent at once).",
    )
    client_batch_linger: float = Field(
        default=0.015,
        ge=0,
        le=1,
        description="Seconds at least between two log transactions of a partition sent by an "
        "EntityBatcher while its contexts come three or more per linger; a batch sent sooner waits "
        "out the rest, gathering what is submitted meanwhile, unless it cannot grow (0: no wait).",
    )
    client_batch_max_in_flight_alone: int = Field(
        default=3,
        ge=0,
        description="Contexts an EntityBatcher sends at once, alone, beyond its log transactions in "
        "flight per partition, when nothing is queued, no expected lock is held in flight and the "
        "partition's linger does not act (0: none).",
    )
    client_transaction_data_timeout: float = Field(
        default=60.0,
        gt=0,
        le=MAX_TIMEOUT_SECONDS,
        description="Seconds Transaction.get_data retries before giving up (at most a day).",
    )
    client_read_your_writes_timeout: float = Field(
        default=10.0,
        ge=0,
        le=MAX_TIMEOUT_SECONDS,
        description="Seconds an attempt waits for the client's own commits to be applied (at most a day).",
    )
    client_max_message_bytes: int = Field(
        default=DEFAULT_MAX_MESSAGE_BYTES,
        ge=1 << 16,
        le=DEFAULT_MAX_MESSAGE_BYTES,
        description="Largest gRPC message in bytes (one transaction must fit); at most 32 MiB, what "
        "servers accept (a larger append would break the connection to the server again and again).",
    )
    client_tracing: bool = Field(
        default=False,
        description="OpenTelemetry traces of this client's transactions, exported over OTLP (the "
        "waltz-py[tracing] extra; OTEL_* variables configure the exporter).",
    )
    client_tracing_sample_ratio: float = Field(
        default=1.0, ge=0, le=1, description="The share of transactions traced when tracing is on (0 to 1)."
    )
    client_tls_ca_file: Path | None = Field(
        default=None, description="PEM CA bundle to verify servers (TLS)."
    )
    client_tls_cert_file: Path | None = Field(
        default=None, description="PEM client certificate (mutual TLS)."
    )
    client_tls_key_file: Path | None = Field(
        default=None, description="PEM private key of the client certificate."
    )

    @model_validator(mode="after")
    def _check(self) -> WaltzClientConfig:
        if (self.client_tls_cert_file is None) != (self.client_tls_key_file is None):
            raise ValueError("client.ssl.certFile and client.ssl.keyFile must be set together")
        return self

    def presented_certificates(self) -> dict[str, Path | None]:
        """The certificates the client presents, by setting: to the servers
        (``client.ssl.certFile``) and to ZooKeeper (``zookeeper.ssl.certFile``); None where there
        is none (docs/operations.md, "Certificates")."""
        return {
            "client.ssl.certFile": self.client_tls_cert_file,
            "zookeeper.ssl.certFile": self.zookeeper_ssl_cert_file,
        }

    def tls_files(self) -> dict[str, Path | None]:
        """Every TLS file the client reads, by setting: for the servers (``client.ssl.*``) and for
        ZooKeeper (``zookeeper.ssl.*``); None where unset."""
        return {
            "client.ssl.caFile": self.client_tls_ca_file,
            "client.ssl.certFile": self.client_tls_cert_file,
            "client.ssl.keyFile": self.client_tls_key_file,
            "zookeeper.ssl.caFile": self.zookeeper_ssl_ca_file,
            "zookeeper.ssl.certFile": self.zookeeper_ssl_cert_file,
            "zookeeper.ssl.keyFile": self.zookeeper_ssl_key_file,
        }

    def tls(self) -> TlsConfig | None:
        """The TLS files for server connections, or None for plaintext.

        Raises:
            TlsFilesError: a file is missing, not PEM, or a key that is not the certificate's
                (:meth:`~waltz.protocol.channels.TlsConfig.check_files`): checked before any server
                is tried (docs/operations.md, "Certificates").
        """
        if self.client_tls_ca_file is None and self.client_tls_cert_file is None:
            return None
        tls = TlsConfig(self.client_tls_ca_file, self.client_tls_cert_file, self.client_tls_key_file)
        tls.check_files(CLIENT_TLS_SETTINGS)
        return tls

    def check_files(self) -> None:
        """Check every file the client reads, as :class:`~waltz.client.client.WaltzClient` does
        when it is made, before anything is contacted (docs/operations.md, "Certificates"): the
        TLS files (``client.ssl.*``, ``zookeeper.ssl.*``) readable, each certificate and CA file
        PEM, the certificates the client presents not expired, the ``client.ssl.*`` files loadable
        together, and the ZooKeeper credential file (``zookeeper.auth.digestFile``) readable. An
        application that reads its configuration before its server starts calls it there, to
        refuse in one line what would otherwise fail the client's start.

        Raises:
            ConfigurationError: a file cannot be read, or a certificate or CA file holds no PEM
                certificate; the message names each setting, its environment variable and file.
            ExpiredCertificateError: a certificate the client presents has expired.
            TlsFilesError: the ``client.ssl.*`` files cannot be loaded together (a key that is not
                the certificate's, a CA file that is not a PEM bundle).
        """
        files = self.tls_files()
        refuse_unreadable_tls_files(
            files,
            holder="the client",
            variables={setting: self.env_variable(self.KEYS[setting]) for setting in files},
        )
        refuse_expired_certificates(
            self.presented_certificates(), peers=CERTIFICATE_PEERS, holder="the client"
        )
        self.tls()
        if self.zookeeper_auth_digest_file is not None:
            try:
                ZooKeeperSecurity.read_digest_file(self.zookeeper_auth_digest_file)
            except ConfigurationError as exc:
                cause = exc.__cause__
                reason = cause.strerror if isinstance(cause, OSError) and cause.strerror else cause or exc
                variable = self.env_variable("zookeeper_auth_digest_file")
                raise ConfigurationError(
                    f"zookeeper.auth.digestFile ({variable}) {self.zookeeper_auth_digest_file} cannot be "
                    f"read ({reason}): give the file that holds the cluster's ZooKeeper credential "
                    "(user:password), or leave it unset for a cluster without one"
                ) from exc
