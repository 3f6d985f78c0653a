"""Local clusters for the demo, tests and benchmarks: Waltz nodes as processes on loopback.

Every node is its own OS process (docs/design/overview.md "Processes and links"), started with the
same command a user would run (``python -m waltz.services.storage ...``), on free loopback ports.

:class:`LocalStorageNode` and :class:`LocalServer` run one node each; the local cluster supervisor
:class:`~waltz.local.cluster.LocalCluster` (ZooKeeper + N storage nodes + M servers) lives in
:mod:`waltz.local.cluster`.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import yaml

from waltz.local.processes import ManagedProcess, free_port
from waltz.private_files import private_directory, write_private

__all__ = ["ZOOKEEPER_SECURITY_PREFIXES", "LocalServer", "LocalStorageNode"]


def _command(
    kind: str, module: str, settings: Mapping[str, object], flags: list[str], config_file: Path | None
) -> list[str]:
    """The argv of a node: ``python -m <module> <flags>``, or, with a configuration file, the
    deployment's own ``python -m waltz <kind> start --config <file>`` after writing its settings
    there as YAML (the keys of docs/configuration.md)."""
    if config_file is None:
        return [sys.executable, "-m", module, *flags]
    private_directory(config_file.parent)
    write_private(config_file, yaml.safe_dump(dict(settings), sort_keys=False))
    return [sys.executable, "-m", "waltz", kind, "start", "--config", str(config_file)]


#: The prefixes of the ZooKeeper security variables (docs/configuration.md, "ZooKeeper security"),
#: which a local cluster gives its servers itself.
ZOOKEEPER_SECURITY_PREFIXES = ("WALTZ_ZOOKEEPER_AUTH_", "WALTZ_ZOOKEEPER_SSL_")


def _environment(env: Mapping[str, str] | None, drop: tuple[str, ...] = ()) -> dict[str, str] | None:
    """A node's environment: this process's, without the variables under ``drop``, then ``env``
    (None: this process's, unchanged)."""
    if not env and not drop:
        return None
    inherited = {name: value for name, value in os.environ.items() if not (drop and name.startswith(drop))}
    return {**inherited, **(env or {})}


def _accepts(host: str, port: int) -> bool:
    with socket.create_connection((host, port), timeout=1.0):
        return True


class _LocalProcess:
    """What the local storage node and server processes share: start, wait, stop, faults."""

    host = "127.0.0.1"
    kind = "process"
    stop_timeout = 10.0
    process: ManagedProcess
    start_timeout: float

    def _ready_ports(self) -> list[int]:
        raise NotImplementedError

    def start(self) -> None:
        """Start the process and wait until its ports accept connections.

        Raises:
            ServiceStartError: the process exited or did not open its ports in time.
        """
        self.launch()
        self.wait_started()

    def launch(self) -> None:
        """Start the process without waiting for its ports (then call :meth:`wait_started`).

        Launching several processes before waiting for any lets them start in parallel.

        Raises:
            RuntimeError: the process is already running.
        """
        self.process.start()

    def wait_started(self, timeout: float | None = None) -> None:
        """Wait until the ports of a launched process accept connections.

        Args:
            timeout: seconds to wait; ``None`` uses ``start_timeout``.

        Raises:
            ServiceStartError: the process exited or did not open its ports in time.
        """
        ports = self._ready_ports()
        self.process.wait_ready(
            lambda: all(_accepts(self.host, port) for port in ports),
            timeout=self.start_timeout if timeout is None else timeout,
            what=f"{self.kind} port(s) {', '.join(map(str, ports))}",
        )

    def kill(self) -> None:
        """Kill the process with SIGKILL (a crash)."""
        self.process.kill()

    def stop(self, timeout: float | None = None) -> int | None:
        """Stop the process gracefully (SIGTERM); returns its exit code."""
        return self.process.terminate(self.stop_timeout if timeout is None else timeout)

    def restart(self) -> None:
        """Kill the process if it runs, then start it again with the same directory and ports."""
        self.process.kill()
        self.start()

    def pause(self) -> None:
        """Freeze the process (SIGSTOP)."""
        self.process.pause()

    def resume(self) -> None:
        """Thaw the process (SIGCONT)."""
        self.process.resume()

    def close(self) -> None:
        """Kill the process if it still runs. Idempotent."""
        self.process.close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class LocalStorageNode(_LocalProcess):
    """A storage node process on loopback, restartable with the same directory and ports.

    Args:
        directory: the storage directory.
        name: a short name for logs (``storage-1``).
        log_path: file receiving the node's output; ``None`` discards it.
        port, admin_port, metrics_port: ports (free ports are chosen when None; the metrics port
            only when ``metrics`` is true).
        extra_args: more ``waltz storage start`` options (e.g. ``--segment-size-threshold``).
        env: extra environment variables for the process.
        start_timeout: seconds to wait for the ports to accept connections.
        host: the address the node binds and advertises (loopback by default; a
            :class:`~waltz.local.netns.NetworkLab` host's address to run it inside that host).
        command_prefix: argv put before the command (e.g. ``ip netns exec <namespace>``, from
            :meth:`~waltz.local.netns.NetworkLab.command_prefix`); empty by default.
        config_file: write the node's settings (directory, host, ports) to this YAML file and
            start it as a deployment does, ``waltz storage start --config <file>``; None passes
            them as options.
        insecure: serve without mutual TLS on purpose (``storage.insecure``); without it the
            node must be given its TLS files (``env``), or it refuses to start.
    """

    kind = "storage node"

    def __init__(
        self,
        directory: Path,
        *,
        name: str = "storage",
        log_path: Path | None = None,
        port: int | None = None,
        admin_port: int | None = None,
        metrics: bool = False,
        metrics_port: int | None = None,
        extra_args: list[str] | None = None,
        env: Mapping[str, str] | None = None,
        start_timeout: float = 30.0,
        host: str | None = None,
        command_prefix: Sequence[str] = (),
        config_file: Path | None = None,
        insecure: bool = False,
    ) -> None:
        if host is not None:
            self.host = host
        self.directory = directory
        self.port = port or free_port()
        self.admin_port = admin_port or free_port()
        self.metrics_port = (metrics_port or free_port()) if metrics else None
        self.start_timeout = start_timeout
        self.config_file = config_file
        settings: dict[str, object] = {
            "storage.directory": str(directory),
            "storage.host": self.host,
            "storage.port": self.port,
            "storage.admin.port": self.admin_port,
        }
        flags = ["--directory", str(directory), "--host", self.host]
        flags += ["--port", str(self.port), "--admin-port", str(self.admin_port)]
        if self.metrics_port is not None:
            settings["storage.metrics.port"] = self.metrics_port
            flags += ["--metrics-port", str(self.metrics_port)]
        if insecure:
            settings["storage.insecure"] = True
            flags += ["--insecure"]
        args = _command("storage", "waltz.services.storage", settings, flags, config_file)
        args += extra_args or []
        self.process = ManagedProcess(
            [*command_prefix, *args], name=name, log_path=log_path, env=_environment(env)
        )

    @property
    def address(self) -> str:
        """``host:port`` of the storage protocol."""
        return f"{self.host}:{self.port}"

    @property
    def admin_address(self) -> str:
        """``host:port`` of the admin protocol."""
        return f"{self.host}:{self.admin_port}"

    def _ready_ports(self) -> list[int]:
        return [self.port, self.admin_port]


class LocalServer(_LocalProcess):
    """A Waltz server process on loopback, restartable with the same port.

    Args:
        zookeeper: ZooKeeper connect string.
        root: the cluster root znode.
        name: a short name for logs (``server-1``).
        log_path: file receiving the server's output; ``None`` discards it.
        port: the server port (a free port when None).
        metrics: also serve ``/metrics`` and ``/health`` (on ``metrics_port``, or a free port).
        metrics_port: the metrics port when ``metrics`` is true (a free port when None).
        session_timeout: ZooKeeper session timeout in seconds.
        extra_args: more ``waltz server start`` options.
        env: extra environment variables (e.g. ``WALTZ_STORE_RETRY_INTERVAL``).
        start_timeout: seconds to wait for the port to accept connections.
        host: the address the node binds and advertises (loopback by default; a
            :class:`~waltz.local.netns.NetworkLab` host's address to run it inside that host).
        command_prefix: argv put before the command (e.g. ``ip netns exec <namespace>``, from
            :meth:`~waltz.local.netns.NetworkLab.command_prefix`); empty by default.
        config_file: write the server's settings (ZooKeeper, root, host, ports, session timeout)
            to this YAML file and start it as a deployment does, ``waltz server start --config
            <file>``; None passes them as options.
        insecure: serve without mutual TLS on purpose (``server.insecure``); without it the
            server must be given its TLS files (``env``), or it refuses to start.
        inherit_zookeeper_security: pass this process's ``WALTZ_ZOOKEEPER_AUTH_*`` and
            ``WALTZ_ZOOKEEPER_SSL_*`` variables on; False gives the server those of ``env`` alone,
            as a local cluster does, which decides its ZooKeeper credential and TLS itself
            (docs/local-cluster.md): another cluster's, exported in the caller's shell, would be
            refused by its ZooKeeper.
    """

    kind = "server"
    stop_timeout = 15.0

    def __init__(
        self,
        zookeeper: str,
        root: str,
        *,
        name: str = "server",
        log_path: Path | None = None,
        port: int | None = None,
        metrics: bool = False,
        metrics_port: int | None = None,
        session_timeout: float = 10.0,
        extra_args: list[str] | None = None,
        env: Mapping[str, str] | None = None,
        start_timeout: float = 30.0,
        host: str | None = None,
        command_prefix: Sequence[str] = (),
        config_file: Path | None = None,
        insecure: bool = False,
        inherit_zookeeper_security: bool = True,
    ) -> None:
        if host is not None:
            self.host = host
        self.port = port or free_port()
        self.metrics_port = (metrics_port or free_port()) if metrics else None
        self.start_timeout = start_timeout
        self.config_file = config_file
        settings: dict[str, object] = {
            "zookeeper.connectString": zookeeper,
            "zookeeper.sessionTimeout": session_timeout,
            "cluster.root": root,
            "server.host": self.host,
            "server.port": self.port,
        }
        settings["server.name"] = name
        flags = ["--zookeeper", zookeeper, "--root", root, "--host", self.host, "--name", name]
        flags += ["--port", str(self.port), "--session-timeout", str(session_timeout)]
        if self.metrics_port is not None:
            settings["server.metrics.port"] = self.metrics_port
            flags += ["--metrics-port", str(self.metrics_port)]
        if insecure:
            settings["server.insecure"] = True
            flags += ["--insecure"]
        args = _command("server", "waltz.services.server", settings, flags, config_file)
        args += extra_args or []
        drop = () if inherit_zookeeper_security else ZOOKEEPER_SECURITY_PREFIXES
        self.process = ManagedProcess(
            [*command_prefix, *args], name=name, log_path=log_path, env=_environment(env, drop)
        )

    @property
    def endpoint(self) -> str:
        """``host:port`` of the server."""
        return f"{self.host}:{self.port}"

    def _ready_ports(self) -> list[int]:
        return [self.port]
