"""The storage node process: gRPC storage and admin ports, metrics, graceful stop on SIGTERM.

Run it with ``waltz storage start --config storage.yaml`` or ``python -m waltz.services.storage``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc

from waltz.protocol import storage_pb2_grpc
from waltz.protocol.channels import bind_port, server_credentials, server_options
from waltz.services.certificate_expiry import watch_certificates
from waltz.services.exposure import is_loopback
from waltz.services.http import HealthHttpServer, server_ssl_context
from waltz.services.runtime import run_until_signalled
from waltz.services.storage.admin_service import StorageAdminServicer
from waltz.services.storage.config import StorageConfig
from waltz.services.storage.metrics import StorageMetrics
from waltz.services.storage.node import StorageNode
from waltz.services.storage.retention_check import RetentionChecker
from waltz.services.storage.service import StorageServicer

__all__ = ["StorageApp", "run_storage"]

log = logging.getLogger(__name__)


class StorageApp:
    """A running storage node: the node, its two gRPC servers and its HTTP endpoint."""

    def __init__(self, config: StorageConfig) -> None:
        self.config = config
        self.metrics = StorageMetrics()
        self.node = StorageNode(
            config.directory,
            segment_size_threshold=config.segment_size_threshold,
            checkpoint_interval=config.checkpoint_interval,
            inline_appends=config.inline_appends,
            inline_append_streams=config.inline_append_streams,
            max_fence_jump=config.fence_max_jump,
            retention=config.retention(),
        )
        self.retention = RetentionChecker(self.node, self.metrics)
        self._servers: list[grpc.aio.Server] = []
        self._http: HealthHttpServer | None = None
        self.port = config.port
        self.admin_port = config.admin_port

    async def start(self) -> None:
        """Open the storage directory and start serving.

        Raises:
            OSError: a port cannot be bound.
            CorruptDataError: the control file is unreadable.
        """
        await asyncio.to_thread(self.node.start)
        storage = StorageServicer(self.node, self.metrics, self.config.max_response_bytes)
        admin = StorageAdminServicer(self.node, self.metrics, storage)
        config = self.config
        credentials = server_credentials(
            config.tls_cert_file, config.tls_key_file, config.tls_ca_file, "storage.ssl"
        )
        watch_certificates(self.metrics.registry, {"storage": config.tls_cert_file})
        if config.insecure and not config.mutual_tls:
            log.warning(
                "storage.insecure is set: the ports on %s serve without mutual TLS%s",
                config.host,
                ", to every user of this host"
                if is_loopback(config.host)
                else ", to every host that reaches this address",
            )
        if credentials is None or config.tls_ca_file is None:
            log.warning(
                "storage and admin ports serve %s without client certificates: no peer roles are checked, "
                "the cluster key alone guards the admin port (set storage.ssl.caFile for mutual TLS; "
                'docs/operations.md, "Roles")',
                "TLS" if credentials is not None else "plaintext",
            )
        for port, is_admin in ((self.config.port, False), (self.config.admin_port, True)):
            server = grpc.aio.server(options=server_options(config.max_message_bytes))
            if is_admin:
                storage_pb2_grpc.add_StorageAdminServiceServicer_to_server(admin, server)
            else:
                storage_pb2_grpc.add_StorageServiceServicer_to_server(storage, server)
            bound = bind_port(server, f"{config.host}:{port}", credentials)
            await server.start()
            self._servers.append(server)
            if is_admin:
                self.admin_port = bound
            else:
                self.port = bound
        config = self.config
        if config.metrics_port is not None:
            tls = (
                server_ssl_context(config.tls_cert_file, config.tls_key_file, config.tls_ca_file)
                if config.tls_cert_file is not None and config.tls_key_file is not None
                else None
            )
            self._http = HealthHttpServer(
                config.host, config.metrics_port, self.metrics.registry, self._health, tls
            )
            self._http.start()
        self.retention.start()
        log.info(
            "storage node ready: directory %s, storage port %d, admin port %d%s%s",
            self.config.directory,
            self.port,
            self.admin_port,
            f", metrics port {self._http.port}" if self._http else "",
            ", TLS" if credentials is not None else "",
        )

    def _health(self) -> tuple[bool, dict[str, Any]]:
        node = self.node
        details: dict[str, Any] = {"initialized": node.initialized}
        if node.initialized:
            details["partitions"] = node.assigned_partitions()
        return True, details

    async def stop(self, grace: float = 5.0) -> None:
        """Stop serving (in-flight requests get ``grace`` seconds) and close the node."""
        await asyncio.gather(*(server.stop(grace) for server in self._servers))
        self._servers.clear()
        await self.retention.close()
        if self._http is not None:
            self._http.close()
            self._http = None
        await asyncio.to_thread(self.node.close)
        log.info("storage node stopped")


def run_storage(config: StorageConfig) -> None:
    """Run a storage node until SIGTERM or SIGINT."""
    run_until_signalled(StorageApp(config))
