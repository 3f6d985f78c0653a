"""``waltz up``: run a local Waltz cluster (ZooKeeper, storage nodes, servers) until Ctrl-C.

A thin layer over :class:`~waltz.local.cluster.LocalCluster`: parse options, start the
cluster, print how to reach it, report processes that die, and stop everything on SIGINT,
SIGTERM or SIGHUP (its terminal closed). Exit codes: 0 stopped on request; 1 the cluster could
not start; 2 bad options; 130 interrupted while starting.
"""

from __future__ import annotations

import inspect
import os
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer

from waltz.cli.options import NodesLogLevelOption
from waltz.errors import ConfigurationError, WaltzError
from waltz.logs import configure_logging

if TYPE_CHECKING:
    from waltz.local.cluster import LocalCluster

#: Seconds between two looks at the processes while the cluster runs.
_WATCH_INTERVAL = 2.0


def up(
    storages: Annotated[int, typer.Option(min=1, help="Number of storage nodes.")] = 3,
    servers: Annotated[int, typer.Option(min=1, help="Number of servers.")] = 2,
    partitions: Annotated[int, typer.Option(min=1, help="Number of partitions.")] = 4,
    replicas: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Replicas per partition, spread round-robin over the storage nodes "
            "(default: 3, or --storages when fewer).",
            show_default=False,
        ),
    ] = None,
    work_dir: Annotated[
        Path | None,
        typer.Option(
            file_okay=False,
            help="Keep data and logs in this directory; running `waltz up` again with it resumes the "
            "same cluster (same ports, same log). Default: a temporary directory, removed at stop.",
            show_default=False,
        ),
    ] = None,
    metrics: Annotated[
        bool, typer.Option("--metrics/--no-metrics", help="Serve /metrics and /health on every node.")
    ] = True,
    zookeeper: Annotated[
        str | None,
        typer.Option(
            help="Use this running ZooKeeper (host:port) instead of starting one.", show_default=False
        ),
    ] = None,
    zookeeper_auth: Annotated[
        bool,
        typer.Option(
            "--zookeeper-auth/--no-zookeeper-auth",
            help="Protect the cluster's znodes with a ZooKeeper digest credential per role made for it, "
            "kept in WORK_DIR/zookeeper-credentials/ROLE.digest (the printed exports name the operator's "
            "for tools, and client.digest for applications).",
        ),
    ] = True,
    name: Annotated[str, typer.Option(help="The cluster's name.")] = "local",
    root: Annotated[
        str | None,
        typer.Option(
            help="Cluster root znode (default: /waltz/NAME; on an external ZooKeeper, a unique one).",
            show_default=False,
        ),
    ] = None,
    session_timeout: Annotated[
        float,
        typer.Option(
            min=1.0,
            help="Servers' ZooKeeper session timeout in seconds: a killed server's partitions move "
            "after about this long.",
        ),
    ] = 4.0,
    timeout: Annotated[
        float, typer.Option(min=1.0, help="Seconds allowed for starting, until every partition is writable.")
    ] = 120.0,
    log_level: NodesLogLevelOption = "WARNING",
    secure: Annotated[
        bool,
        typer.Option(
            "--secure/--insecure",
            help="Secure (the default): make a CA and role certificates (node, client, operator, admin) "
            "in WORK_DIR/tls and serve mutual TLS with role checks on every port; the output says which "
            "files to use. --insecure serves plaintext with no roles: anyone who reaches a port may act "
            "on the cluster (for speed runs; pair it with --no-zookeeper-auth for open znodes too).",
        ),
    ] = True,
    network: Annotated[
        str,
        typer.Option(
            help="loopback: every process on 127.0.0.1 and free ports. namespaces: ZooKeeper, every "
            "storage node and every server on a host of its own (a network namespace with its own "
            "address on a bridge, a deployment's ports, started from a configuration file, as "
            "docs/deploy.md does); needs root and iproute2.",
        ),
    ] = "loopback",
    client_hosts: Annotated[
        int,
        typer.Option(
            min=0,
            help="With --network namespaces: hosts client-0... for your clients "
            "(ip netns exec NAMESPACE COMMAND; the output names the namespaces).",
        ),
    ] = 0,
) -> None:
    """Run a local Waltz cluster on loopback (or on hosts in network namespaces) until Ctrl-C or SIGTERM.

    Starts ZooKeeper (Debian's package, tickTime 500 ms), the storage nodes and the servers as
    processes on free 127.0.0.1 ports, creates the cluster, waits until every partition has a
    writable owner, and prints how to connect: the ZooKeeper connect string, the cluster root, the
    server endpoints, the storage and admin ports and the metrics ports.

    Stop it with Ctrl-C, SIGTERM or by closing its terminal (SIGHUP): servers first, then storage
    nodes, then ZooKeeper. Should it be killed (kill -9), every process it started dies with it.

    Example: waltz up --storages 3 --servers 2 --partitions 8 --work-dir ./waltz-data

    With --network namespaces every process runs on a host of its own, as on the machines of a
    deployment, and the machine reaches them through a bridge (a /24 of 10.77.128.0/17); the network is
    removed at stop, and a crashed run's by the next one.

    Every port serves mutual TLS and checks the role in each peer's certificate (client, server,
    operator, admin); the certificates are made in WORK_DIR/tls (node.pem, with the server
    role, for the storage nodes and servers; client.pem, operator.pem, admin.pem), and the
    cluster's znodes take a ZooKeeper credential per role. --insecure (and --no-zookeeper-auth) opt
    out.
    """
    from waltz.local.cluster import LocalCluster
    from waltz.local.options import NetworkOptions, ProcessOptions, SecurityOptions

    configure_logging(log_level)
    try:
        if network not in ("loopback", "namespaces"):
            raise ConfigurationError(f"--network must be loopback or namespaces, not {network!r}")
        if client_hosts and network != "namespaces":
            raise ConfigurationError(
                f"--client-hosts {client_hosts} makes hosts of namespace mode: add --network namespaces "
                "(or leave --client-hosts out: on loopback, clients run on this machine)"
            )
        if network == "namespaces":
            from waltz.local.netns import network_lab_unavailable

            reason = network_lab_unavailable()
            if reason is not None:
                raise ConfigurationError(f"--network namespaces: {reason}")
        cluster = LocalCluster(
            storages=storages,
            servers=servers,
            partitions=partitions,
            replicas=replicas,
            name=name,
            root=root,
            work_dir=work_dir,
            zookeeper=zookeeper,
            processes=ProcessOptions(metrics=metrics, session_timeout=session_timeout, start_timeout=timeout),
            security=SecurityOptions(zookeeper_auth=zookeeper_auth, secure=secure),
            network=NetworkOptions(
                mode="namespaces" if network == "namespaces" else "loopback", client_hosts=client_hosts
            ),
            keep_on_failure=True,
        )
    except ConfigurationError as exc:
        typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
        raise typer.Exit(2) from exc

    received: list[str] = []

    def interrupt(signum: int, frame: FrameType | None) -> None:
        received.append(signal.Signals(signum).name)
        raise KeyboardInterrupt

    # SIGHUP: the terminal that runs it was closed.
    stop_signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, interrupt) for sig in stop_signals}
    code = 0
    try:
        nodes = f"{storages} storage node(s) and {servers} server(s)"
        try:
            # A work directory another cluster runs on, or that holds another one, is refused
            # before the start line, which would name this run's counts, not that cluster's.
            cluster.prepare()
            typer.echo(
                f"starting {nodes} on ZooKeeper {zookeeper}..."
                if zookeeper
                else f"starting ZooKeeper, {nodes}..."
            )
            cluster.start()
        except KeyboardInterrupt:
            # start() has stopped whatever it had started before re-raising.
            typer.echo(f"{received[-1] if received else 'interrupted'} while starting: stopped everything")
            code = 130
        except (WaltzError, OSError) as exc:
            failed_dir = cluster.failed_start_dir
            typer.secho(
                f"error: the local cluster could not start: {exc}"
                + (
                    f"\nits temporary work directory {failed_dir}, with every log, is kept: "
                    "remove it when done"
                    if failed_dir
                    else ""
                ),
                err=True,
                fg=typer.colors.RED,
            )
            code = 1
        if code == 0:
            try:
                typer.echo(cluster.describe())
                typer.echo(
                    f"ready in {cluster.startup_seconds or 0.0:.1f}s. Press Ctrl-C (or run "
                    f"`kill {os.getpid()}`) to stop the cluster."
                )
                _watch(cluster)
            except KeyboardInterrupt:
                typer.echo(f"\n{received[-1] if received else 'interrupted'}: stopping the cluster...")
    finally:
        # Stopping takes a few seconds: a second Ctrl-C must not leave processes behind.
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        try:
            cluster.close()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    if code == 0:
        kept = f"data and logs kept in {work_dir}" if work_dir else "its temporary directory was removed"
        stopped = "the servers and the storage nodes"
        stopped = stopped if zookeeper else "the servers, the storage nodes and ZooKeeper"
        typer.echo(f"stopped {stopped}; {kept}")
    raise typer.Exit(code)


# typer keeps the single line breaks of a docstring paragraph: join them so that the help wraps.
up.__doc__ = "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(up.__doc__ or "").split("\n\n"))


def _watch(cluster: LocalCluster) -> None:
    """Report processes that exit on their own, until a signal raises KeyboardInterrupt."""
    expected = set(cluster.pids())
    tick = threading.Event()
    while True:
        tick.wait(_WATCH_INTERVAL)
        running = set(cluster.pids())
        logs = cluster.log_paths()
        for name in sorted(expected - running):
            log = logs.get(name)
            typer.secho(
                f"warning: {name} exited; "
                + (f"see its log {log} " if log is not None else "")
                + "(the cluster keeps running without it)",
                err=True,
                fg=typer.colors.YELLOW,
            )
        expected = running
