"""A real standalone Apache ZooKeeper on loopback, run from Debian's ``zookeeper`` package.

Tests, the demo and the local cluster supervisor need a ZooKeeper they can start, kill and restart
(docs/design/overview.md "Packages and their imports"). :class:`LocalZooKeeper` runs
``ZooKeeperServerMain`` as a :class:`~waltz.local.processes.ManagedProcess` with a ``zoo.cfg`` it
writes, bound to 127.0.0.1 only, the admin server disabled, and a data directory it owns::

    with LocalZooKeeper(tick_time_ms=500) as zookeeper:
        client = KazooClient(hosts=zookeeper.connect_string)

Given a PEM key store and trust store, it also serves TLS on a secure client port (ZooKeeper's
Netty connection factory, from Debian's ``libnetty-java`` jars), for testing ZooKeeper TLS
(docs/design/zookeeper.md, "Security").

When the Debian jars are missing but a Docker engine answers, :class:`DockerZooKeeper` runs the
``zookeeper:3.8`` image through testcontainers instead (start and close only).
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from waltz.errors import ConfigurationError
from waltz.local.processes import ManagedProcess, ServiceStartError, free_port, wait_until
from waltz.private_files import private_directory, write_private

__all__ = [
    "DEBIAN_JAVA_DIR",
    "DockerZooKeeper",
    "LocalZooKeeper",
    "docker_engine_available",
    "find_java",
    "find_zookeeper_classpath",
    "four_letter_word",
]

_LOG = logging.getLogger(__name__)

#: Where Debian installs Java libraries (``libzookeeper-java`` and its dependencies).
DEBIAN_JAVA_DIR = Path("/usr/share/java")

#: Jars ZooKeeper 3.8's standalone server loads (measured with ``-Xlog:class+load``). zookeeper.jar's
#: manifest names most of them too, but listing them keeps the class path independent of it.
_REQUIRED_JARS = (
    "zookeeper.jar",
    "zookeeper-jute.jar",
    "slf4j-api.jar",
    "metrics-core.jar",
    "snappy-java.jar",
)
#: Netty jars of the secure client port (ZooKeeper's NettyServerCnxnFactory).
_NETTY_JARS = (
    "netty-handler.jar",
    "netty-transport.jar",
    "netty-buffer.jar",
    "netty-codec.jar",
    "netty-common.jar",
    "netty-resolver.jar",
    "netty-transport-native-epoll.jar",
)
#: An SLF4J binding; without it ZooKeeper logs nothing at all.
_LOGGING_JAR = "slf4j-simple.jar"

_INSTALL_HINT = (
    "install Debian's ZooKeeper and a Java runtime: apt-get install -y zookeeper default-jre-headless"
)

#: The four-letter-word commands the server answers (``ruok`` and ``srvr`` are used here).
_FOUR_LETTER_WORDS = "ruok,srvr,stat,mntr,envi"

_HOST = "127.0.0.1"
_BIND_ATTEMPTS = 3


def find_zookeeper_classpath(java_dir: Path = DEBIAN_JAVA_DIR) -> str:
    """Return the Java class path that runs ZooKeeper's standalone server from Debian's jars.

    Args:
        java_dir: the directory holding the jars.

    Returns:
        The jars joined with ``:``, ``zookeeper.jar`` first; includes ``slf4j-simple.jar`` (the
        server's logging) when it is installed.

    Raises:
        ConfigurationError: a required jar is missing; the message names the Debian packages to
            install.
    """
    missing = [jar for jar in _REQUIRED_JARS if not (java_dir / jar).is_file()]
    if missing:
        raise ConfigurationError(
            f"cannot run ZooKeeper: {', '.join(missing)} not found in {java_dir}; {_INSTALL_HINT}"
        )
    jars = [java_dir / jar for jar in _REQUIRED_JARS]
    if (java_dir / _LOGGING_JAR).is_file():
        jars.append(java_dir / _LOGGING_JAR)
    else:
        _LOG.warning("%s not found in %s: ZooKeeper will log nothing", _LOGGING_JAR, java_dir)
    return ":".join(str(jar) for jar in jars)


def find_java(java: str | None = None) -> str:
    """Find the ``java`` executable.

    Args:
        java: a path to, or the name of, the executable; ``None`` looks ``java`` up on ``PATH``.

    Returns:
        The absolute path of an executable file.

    Raises:
        ConfigurationError: no such executable; the message names the Debian packages to install.
    """
    found = shutil.which(java if java is not None else "java")
    if found is None:
        where = f"{java!r} is not an executable" if java is not None else "no 'java' on PATH"
        raise ConfigurationError(f"cannot run ZooKeeper: {where}; {_INSTALL_HINT}")
    return os.path.abspath(found)


def four_letter_word(host: str, port: int, command: str, *, timeout: float = 2.0) -> str:
    """Send a ZooKeeper four-letter-word command (``ruok``, ``srvr``, ``mntr``...) and return the reply.

    Args:
        host: the server's address.
        port: the server's client port.
        command: the four-letter word; the server must whitelist it.
        timeout: socket timeout in seconds, for connecting and for each read.

    Returns:
        The whole reply, decoded as UTF-8 (the server closes the connection after it).

    Raises:
        OSError: the server could not be reached or did not answer in time.
    """
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(command.encode("ascii"))
        chunks = []
        while chunk := sock.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


class LocalZooKeeper:
    """A standalone ZooKeeper server process (on 127.0.0.1 unless given a host), owned by this object.

    The server keeps its port and data directory across :meth:`stop`/:meth:`kill` and
    :meth:`start`/:meth:`restart`, as a real node that crashes and comes back would. Entering the
    context starts it (unless it is running); leaving closes it.

    Files in ``data_dir``: ``zoo.cfg``, ``zookeeper.log`` (the server's output, appended to on each
    start) and ZooKeeper's own ``version-2/`` (snapshots and transaction logs).

    Args:
        data_dir: the server's data directory (created if needed, kept at close); ``None`` creates a
            temporary directory that :meth:`close` removes.
        port: the client port; ``None`` picks a free one (and another one if it is taken before
            the first start).
        tick_time_ms: ZooKeeper's ``tickTime`` in milliseconds; session timeouts are bounded to
            2 to 20 ticks, so a short tick (200 to 500 ms) makes session expiry take seconds.
        java: the ``java`` executable (path or name); ``None`` uses ``shutil.which("java")``.
        java_dir: where the ZooKeeper jars are (Debian's ``/usr/share/java``).
        heap_mb: the JVM's maximum heap in MiB.
        startup_timeout: seconds :meth:`start` waits for the server to answer.
        tls_key_store: a PEM file holding the server's private key and certificate; set (with
            ``tls_trust_store``), the server also serves TLS on :attr:`secure_port` and asks
            clients for a certificate the trust store verifies.
        tls_trust_store: a PEM CA bundle verifying client certificates.
        host: the address the server binds (loopback by default; a
            :class:`~waltz.local.netns.NetworkLab` host's address to run it inside that host).
        command_prefix: argv put before the ``java`` command (e.g. ``ip netns exec <namespace>``,
            from :meth:`~waltz.local.netns.NetworkLab.command_prefix`); empty by default.

    Raises:
        ConfigurationError: java or the ZooKeeper jars (or, for TLS, the Netty jars) are missing
            (the message says what to install).
    """

    def __init__(
        self,
        *,
        data_dir: Path | None = None,
        port: int | None = None,
        tick_time_ms: int = 2000,
        java: str | None = None,
        java_dir: Path = DEBIAN_JAVA_DIR,
        heap_mb: int = 256,
        startup_timeout: float = 30.0,
        tls_key_store: Path | None = None,
        tls_trust_store: Path | None = None,
        host: str | None = None,
        command_prefix: Sequence[str] = (),
    ) -> None:
        self._host = host or _HOST
        if tick_time_ms <= 0:
            raise ValueError(f"tick_time_ms must be positive, got {tick_time_ms}")
        if (tls_key_store is None) != (tls_trust_store is None):
            raise ValueError("tls_key_store and tls_trust_store go together")
        self._java = find_java(java)
        self._classpath = find_zookeeper_classpath(java_dir)
        self._tls = (tls_key_store, tls_trust_store) if tls_key_store and tls_trust_store else None
        self._secure_port: int | None = None
        if self._tls is not None:
            missing = [jar for jar in _NETTY_JARS if not (java_dir / jar).is_file()]
            if missing:
                raise ConfigurationError(
                    f"cannot serve ZooKeeper TLS: {', '.join(missing)} not found in {java_dir}; "
                    "install Debian's Netty: apt-get install -y libnetty-java"
                )
            self._classpath += "".join(f":{java_dir / jar}" for jar in _NETTY_JARS)
            self._secure_port = free_port()
        self._tick_time_ms = tick_time_ms
        self._heap_mb = heap_mb
        self._startup_timeout = startup_timeout
        self._port_chosen = port is None
        self._port = port if port is not None else free_port()
        self._owns_data_dir = data_dir is None
        if data_dir is None:
            data_dir = Path(tempfile.mkdtemp(prefix="waltz-zookeeper-"))
        # ZooKeeper's snapshots and transaction log hold every znode (the cluster key among them):
        # the directory is the owner's only, and the server runs with the umask 077.
        private_directory(data_dir, narrow=True)
        self._data_dir = data_dir.resolve()
        self._process = ManagedProcess(
            [
                *command_prefix,
                self._java,
                f"-Xmx{heap_mb}m",
                "-XX:+UseSerialGC",
                "-Dzookeeper.admin.enableServer=false",
                "-cp",
                self._classpath,
                "org.apache.zookeeper.server.ZooKeeperServerMain",
                str(self.config_path),
            ],
            name="zookeeper",
            log_path=self.log_path,
            cwd=self._data_dir,
        )
        self._started_once = False
        self._closed = False

    # --- properties -------------------------------------------------------------------------------

    @property
    def host(self) -> str:
        """The address the server listens on (loopback unless given)."""
        return self._host

    @property
    def port(self) -> int:
        """The client port."""
        return self._port

    @property
    def connect_string(self) -> str:
        """The connect string for clients, ``"127.0.0.1:PORT"``."""
        return f"{self._host}:{self._port}"

    @property
    def secure_port(self) -> int | None:
        """The TLS client port, or None without TLS."""
        return self._secure_port

    @property
    def secure_connect_string(self) -> str:
        """The connect string of the TLS client port, ``"127.0.0.1:PORT"``.

        Raises:
            RuntimeError: the server was made without TLS.
        """
        if self._secure_port is None:
            raise RuntimeError("this LocalZooKeeper serves no TLS port (no tls_key_store)")
        return f"{self._host}:{self._secure_port}"

    @property
    def tick_time_ms(self) -> int:
        """ZooKeeper's ``tickTime`` in milliseconds."""
        return self._tick_time_ms

    @property
    def data_dir(self) -> Path:
        """The server's data directory."""
        return self._data_dir

    @property
    def config_path(self) -> Path:
        """The ``zoo.cfg`` this object writes before each start."""
        return self._data_dir / "zoo.cfg"

    @property
    def log_path(self) -> Path:
        """The server's output (stdout and stderr), appended to on each start."""
        return self._data_dir / "zookeeper.log"

    @property
    def process(self) -> ManagedProcess:
        """The server's OS process (for pause/resume, its PID, its exit code)."""
        return self._process

    def is_running(self) -> bool:
        """Whether the server process runs (it may not answer yet, or be paused)."""
        return self._process.is_running()

    # --- life cycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the server and wait until it serves requests.

        Raises:
            RuntimeError: the server is already running, or this object was closed.
            ServiceStartError: the server exited or did not answer within ``startup_timeout``
                seconds; the message ends with the tail of its log.
        """
        if self._closed:
            raise RuntimeError(f"ZooKeeper on port {self._port} was closed; create a new LocalZooKeeper")
        if self.is_running():
            raise RuntimeError(f"ZooKeeper on port {self._port} is already running")
        # Only a port we picked ourselves, before the first start, may be replaced when taken.
        attempts = _BIND_ATTEMPTS if self._port_chosen and not self._started_once else 1
        for attempt in range(1, attempts + 1):
            self._write_config()
            self._process.start()
            try:
                self._process.wait_ready(
                    self.is_serving,
                    timeout=self._startup_timeout,
                    what=f"ZooKeeper to serve on {self.connect_string}",
                )
            except ServiceStartError as error:
                self._process.kill()
                if attempt < attempts and "Address already in use" in str(error):
                    _LOG.warning("port %d was taken before ZooKeeper bound it; trying another", self._port)
                    self._port = free_port()
                    continue
                raise
            break
        self._started_once = True
        _LOG.info("ZooKeeper serves on %s (data in %s)", self.connect_string, self._data_dir)

    def stop(self, timeout: float = 10.0) -> int | None:
        """Stop the server gracefully (SIGTERM; SIGKILL after ``timeout`` seconds).

        Args:
            timeout: seconds to wait for a clean exit.

        Returns:
            The exit code, or ``None`` if the server was never started.
        """
        return self._process.terminate(timeout)

    def kill(self) -> int | None:
        """Kill the server with SIGKILL, as a crash would; data already logged survives.

        Returns:
            The exit code, or ``None`` if the server was never started.
        """
        return self._process.kill()

    def restart(self) -> None:
        """Stop the server if it runs, then start it again on the same port and data directory.

        Raises:
            ServiceStartError: as :meth:`start`.
        """
        if self.is_running():
            self.stop()
        self.start()

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): clients time out, sessions look dead on resume."""
        self._process.pause()

    def resume(self) -> None:
        """Let a paused server continue (SIGCONT)."""
        self._process.resume()

    def close(self) -> None:
        """Kill the server and remove the data directory if this object created it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._process.close()
        if self._owns_data_dir:
            shutil.rmtree(self._data_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        if not self.is_running():
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # --- probes and diagnostics -------------------------------------------------------------------

    def four_letter_word(self, command: str, *, timeout: float = 2.0) -> str:
        """Send a four-letter-word command to this server (see :func:`four_letter_word`)."""
        return four_letter_word(self._host, self._port, command, timeout=timeout)

    def ruok(self) -> bool:
        """Whether the server answers ``ruok`` with ``imok`` (it runs; it may not serve yet)."""
        try:
            return self.four_letter_word("ruok") == "imok"
        except OSError:
            return False

    def is_serving(self) -> bool:
        """Whether the server has loaded its data and serves client requests (``srvr`` shows a mode)."""
        try:
            return "Mode:" in self.four_letter_word("srvr")
        except OSError:
            return False

    def log_tail(self, n_lines: int = 50) -> str:
        """The last lines of the server's log, for error messages."""
        return self._process.log_tail(n_lines)

    def __repr__(self) -> str:
        return f"LocalZooKeeper({self.connect_string}, data_dir={str(self._data_dir)!r}, {self._process!r})"

    def _write_config(self) -> None:
        lines = [
            f"tickTime={self._tick_time_ms}",
            f"dataDir={self._data_dir}",
            f"clientPort={self._port}",
            f"clientPortAddress={self._host}",
            "admin.enableServer=false",
            "maxClientCnxns=0",
            f"4lw.commands.whitelist={_FOUR_LETTER_WORDS}",
        ]
        if self._tls is not None:
            key_store, trust_store = self._tls
            lines += [
                f"secureClientPort={self._secure_port}",
                f"secureClientPortAddress={self._host}",
                "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
                f"ssl.keyStore.location={key_store}",
                "ssl.keyStore.type=PEM",
                f"ssl.trustStore.location={trust_store}",
                "ssl.trustStore.type=PEM",
            ]
        write_private(self.config_path, "\n".join([*lines, ""]))


def docker_engine_available() -> bool:
    """Whether the ``docker`` package is importable and a Docker engine answers within 2 s."""
    try:
        docker: Any = importlib.import_module("docker")
    except ImportError:
        return False
    try:
        return bool(docker.from_env(timeout=2).ping())
    except Exception as error:  # DockerException, or requests' errors when no engine runs
        _LOG.debug("no usable Docker engine: %r", error)
        return False


class DockerZooKeeper:
    """ZooKeeper 3.8 in a container (testcontainers), for machines without Debian's package.

    Only start and close: tests that kill or restart ZooKeeper need :class:`LocalZooKeeper`.
    Requires the ``testcontainers`` package and a running Docker engine.

    Args:
        tick_time_ms: ZooKeeper's ``tickTime`` in milliseconds.
        image: the image to run.
        startup_timeout: seconds :meth:`start` waits for the server to answer.
    """

    def __init__(
        self, *, tick_time_ms: int = 2000, image: str = "zookeeper:3.8", startup_timeout: float = 60.0
    ) -> None:
        container_module: Any = importlib.import_module("testcontainers.core.container")
        self._container: Any = (
            container_module.DockerContainer(image)
            .with_exposed_ports(2181)
            .with_env("ZOO_TICK_TIME", str(tick_time_ms))
            .with_env("ZOO_4LW_COMMANDS_WHITELIST", _FOUR_LETTER_WORDS)
            .with_env("ZOO_ADMINSERVER_ENABLED", "false")
        )
        self._startup_timeout = startup_timeout
        self._address: tuple[str, int] | None = None

    @property
    def connect_string(self) -> str:
        """The connect string for clients, ``"HOST:PORT"`` of the mapped port.

        Raises:
            RuntimeError: the container was not started.
        """
        if self._address is None:
            raise RuntimeError("DockerZooKeeper is not started")
        return f"{self._address[0]}:{self._address[1]}"

    def start(self) -> None:
        """Start the container and wait until ZooKeeper serves requests.

        Raises:
            TimeoutError: ZooKeeper did not answer within ``startup_timeout`` seconds.
        """
        self._container.start()
        host = str(self._container.get_container_host_ip())
        port = int(self._container.get_exposed_port(2181))
        self._address = (host, port)
        wait_until(
            lambda: "Mode:" in four_letter_word(host, port, "srvr"),
            timeout=self._startup_timeout,
            what=f"ZooKeeper in a container to serve on {host}:{port}",
        )

    def close(self) -> None:
        """Stop and remove the container. Idempotent."""
        if self._address is not None:
            self._address = None
            self._container.stop()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
