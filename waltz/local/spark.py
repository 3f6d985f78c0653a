"""A Spark standalone cluster on loopback: one master and a few workers from the installed PySpark.

Source: docs/design/spark.md "Running on a cluster" (the rebuild's reads, writes and drift check
run in executors, in processes other than the driver). Tests and the rebuild benchmark use it to
run ``waltz rebuild --master spark://...`` against a real cluster::

    with LocalSparkCluster(workers=2, work_dir=tmp) as spark_cluster:
        subprocess.run(["waltz", "rebuild", "--master", spark_cluster.master_url, ...])

Each daemon is ``spark-class org.apache.spark.deploy.master.Master`` (or ``...worker.Worker``) of
PySpark's own ``bin/``, run as a :class:`~waltz.local.processes.ManagedProcess` in its own process
group: closing the cluster stops the workers (and the executors and Python workers they forked)
and then the master, whatever happened before. Every address is on loopback: the master on
127.0.0.1, worker ``i`` on ``127.0.0.{i+1}`` when the kernel lets us bind it (Linux routes all of
127.0.0.0/8 to ``lo``), 127.0.0.1 otherwise. The master's REST submission server is off. This
module never imports PySpark; it only finds where it is installed.

Workers may instead run on hosts of their own (``worker_hosts``: a network namespace's address
and the prefix that runs a command there, e.g. the client hosts of a
:class:`~waltz.local.cluster.LocalCluster` in namespace mode), with the master on an address they
reach (``master_host``, the lab's bridge address): their executors then run on those hosts too.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import socket
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from waltz.errors import ConfigurationError
from waltz.local.processes import ManagedProcess, free_port

__all__ = ["LocalSparkCluster", "SparkHost", "loopback_hosts", "spark_home"]

_LOG = logging.getLogger(__name__)

_MASTER_CLASS = "org.apache.spark.deploy.master.Master"
_WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
#: A worker's ports on a host of its own (Spark's defaults; each host has its own port space).
_HOST_WORKER_PORT = 7078
_HOST_WORKER_UI_PORT = 8081


@dataclass(frozen=True)
class SparkHost:
    """A host a Spark worker runs on: its address and the argv prefix that runs a command there.

    Attributes:
        address: the address the worker and its executors bind and advertise.
        command_prefix: e.g. ``ip netns exec <namespace>``
            (:meth:`~waltz.local.netns.NetworkLab.command_prefix`); empty for this machine.
    """

    address: str
    command_prefix: tuple[str, ...] = ()


def spark_home() -> Path:
    """The directory of the installed PySpark (its ``bin/spark-class`` starts the daemons).

    ``SPARK_HOME`` wins when set.

    Raises:
        ConfigurationError: PySpark is not installed, or has no ``bin/spark-class``.
    """
    home = os.environ.get("SPARK_HOME")
    if not home:
        spec = importlib.util.find_spec("pyspark")
        if spec is None or spec.origin is None:
            raise ConfigurationError(
                "PySpark is not installed: install the spark extra (pip install 'waltz-py[spark]')"
            )
        home = str(Path(spec.origin).parent)
    path = Path(home)
    if not (path / "bin" / "spark-class").exists():
        raise ConfigurationError(f"{path / 'bin' / 'spark-class'} does not exist: set SPARK_HOME to a Spark")
    return path


def loopback_hosts(count: int) -> list[str]:
    """``count`` loopback addresses: ``127.0.0.1``, ``127.0.0.2``, ... (127.0.0.1 where one fails to bind)."""
    hosts = []
    for i in range(count):
        host = f"127.0.0.{i + 1}"
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind((host, 0))
        except OSError:
            host = "127.0.0.1"
        hosts.append(host)
    return hosts


class LocalSparkCluster:
    """A Spark standalone master and ``workers`` workers on loopback, as processes of this machine.

    Args:
        work_dir: logs (``master.log``, ``worker-<i>.log``), the workers' directories and the
            daemons' properties file go here.
        workers: number of workers.
        cores_per_worker: cores each worker offers (the executors' cores).
        memory_per_worker: memory each worker offers to executors (Spark size, ``"1g"``); an
            application's ``spark.executor.memory`` (default 1g) must fit in it.
        daemon_memory: heap of the master and worker JVMs themselves.
        env: extra environment of the workers, inherited by executors and their Python workers
            (``PYTHONPATH`` so that they import waltz, for instance); the rest is this process's.
        startup_timeout: seconds to wait for the master, then for every worker to register.
        master_host: the address the master binds (127.0.0.1 by default); workers on other hosts
            need one they reach.
        worker_hosts: the hosts of the workers, one worker each (``workers`` is then their
            number); None puts them on loopback addresses of this machine.
    """

    def __init__(
        self,
        work_dir: Path,
        *,
        workers: int = 2,
        cores_per_worker: int = 1,
        memory_per_worker: str = "1g",
        daemon_memory: str = "256m",
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 180.0,
        master_host: str = "127.0.0.1",
        worker_hosts: Sequence[SparkHost] | None = None,
    ) -> None:
        if worker_hosts is not None:
            workers = len(worker_hosts)
        if workers < 1:
            raise ValueError(f"a Spark cluster needs at least one worker, not {workers}")
        self._home = spark_home()
        self._work_dir = Path(work_dir)
        self._workers = workers
        self._cores = cores_per_worker
        self._memory = memory_per_worker
        self._daemon_memory = daemon_memory
        self._env = dict(env or {})
        self._timeout = startup_timeout
        self._host = master_host
        self._placed = list(worker_hosts) if worker_hosts is not None else None
        self._port = 0
        self._ui_port = 0
        self._master: ManagedProcess | None = None
        self._worker_processes: list[ManagedProcess] = []
        self.worker_hosts: list[str] = []

    @property
    def master_url(self) -> str:
        """``spark://HOST:PORT`` (``master_host``), the URL to give ``--master``.

        Raises:
            RuntimeError: the cluster is not started.
        """
        if self._master is None:
            raise RuntimeError("LocalSparkCluster is not started")
        return f"spark://{self._host}:{self._port}"

    @property
    def ui_url(self) -> str:
        """The master's web UI (``/json/`` gives its state)."""
        return f"http://{self._host}:{self._ui_port}"

    def processes(self) -> list[ManagedProcess]:
        """The master's and the workers' processes (started ones)."""
        return ([self._master] if self._master is not None else []) + list(self._worker_processes)

    def _daemon_env(self, host: str) -> dict[str, str]:
        env = {**os.environ, **self._env}
        env.update(
            SPARK_HOME=str(self._home),
            SPARK_LOCAL_IP=host,
            SPARK_NO_DAEMONIZE="1",
            SPARK_DAEMON_MEMORY=self._daemon_memory,
            SPARK_LOG_DIR=str(self._work_dir),
            SPARK_CONF_DIR=str(self._work_dir / "conf"),
        )
        return env

    def state(self) -> dict[str, Any]:
        """The master's state from its ``/json/`` page (``status``, ``aliveworkers``, ``workers``...).

        Raises:
            OSError: the master does not answer.
        """
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=5) as reply:
            state: dict[str, Any] = json.load(reply)
        return state

    def start(self) -> None:
        """Start the master, wait until it is ALIVE, start the workers and wait until all registered.

        Raises:
            ServiceStartError: a daemon exited or did not get ready within ``startup_timeout``
                (the message ends with its log's tail); whatever was started is stopped again.
        """
        if self._master is not None:
            raise RuntimeError("LocalSparkCluster is already started")
        conf = self._work_dir / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        properties = conf / "spark-defaults.conf"
        properties.write_text("spark.master.rest.enabled false\nspark.ui.reverseProxy false\n")
        spark_class = str(self._home / "bin" / "spark-class")
        self._port = free_port(self._host)
        self._ui_port = free_port(self._host)
        try:
            self._master = ManagedProcess(
                [
                    spark_class,
                    _MASTER_CLASS,
                    "--host",
                    self._host,
                    "--port",
                    str(self._port),
                    "--webui-port",
                    str(self._ui_port),
                    "--properties-file",
                    str(properties),
                ],
                name="spark-master",
                log_path=self._work_dir / "master.log",
                env=self._daemon_env(self._host),
            )
            self._master.start()
            self._master.wait_ready(
                lambda: self.state().get("status") == "ALIVE",
                timeout=self._timeout,
                what=f"the Spark master on {self.ui_url} to be ALIVE",
                interval=0.25,
            )
            placed = self._placed or [SparkHost(host) for host in loopback_hosts(self._workers)]
            self.worker_hosts = [h.address for h in placed]
            for index, place in enumerate(placed):
                host = place.address
                own_host = bool(place.command_prefix)  # a port space of its own
                worker_dir = self._work_dir / f"worker-{index}"
                worker_dir.mkdir(parents=True, exist_ok=True)
                process = ManagedProcess(
                    [
                        *place.command_prefix,
                        spark_class,
                        _WORKER_CLASS,
                        "--host",
                        host,
                        "--port",
                        str(_HOST_WORKER_PORT if own_host else free_port(host)),
                        "--webui-port",
                        str(_HOST_WORKER_UI_PORT if own_host else free_port(host)),
                        "--cores",
                        str(self._cores),
                        "--memory",
                        self._memory,
                        "--work-dir",
                        str(worker_dir),
                        "--properties-file",
                        str(properties),
                        self.master_url,
                    ],
                    name=f"spark-worker-{index}",
                    log_path=self._work_dir / f"worker-{index}.log",
                    env=self._daemon_env(host),
                )
                self._worker_processes.append(process)
                process.start()
            for process in self._worker_processes:
                process.wait_ready(
                    lambda: self.state().get("aliveworkers", 0) >= self._workers,
                    timeout=self._timeout,
                    what=f"{self._workers} Spark workers to register with {self.master_url}",
                    interval=0.25,
                )
            self._master.wait_ready(lambda: True, timeout=1, what="the Spark master to stay up")
        except BaseException:
            self.close()
            raise
        _LOG.info("Spark standalone cluster %s with workers on %s", self.master_url, self.worker_hosts)

    def close(self) -> None:
        """Stop the workers (with their executors), then the master. Idempotent."""
        for process in reversed(self._worker_processes):
            process.terminate(timeout=10)
        self._worker_processes = []
        if self._master is not None:
            self._master.terminate(timeout=10)
            self._master = None

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
