"""The cluster a ``waltz perf`` command measures: a local one it starts, or an existing one.

Shared by the commands of :mod:`waltz.cli.perf` and :mod:`waltz.cli.perf_inventory`: the options
``--local``/``--storages``/``--servers``/``--partitions`` or ``--zookeeper``/``--root``/``--config``
become a :func:`waltz.perf.target.perf_cluster`, and its failures the commands' exit codes (1: the
run could not complete; 2: bad options, configuration, or a cluster that could not be reached or
started).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer

from waltz.cli.output import fail
from waltz.errors import ConfigurationError, WaltzError, WaltzTimeoutError

__all__ = ["describe_target", "perf_target"]


@contextmanager
def perf_target(
    local: bool,
    storages: int,
    servers: int,
    partitions: int,
    config: Path | None,
    zk: str | None,
    root: str | None,
    secure: bool = True,
) -> Iterator[Any]:
    """Start a local cluster (``local``) or reach an existing one; yield the target (its client
    ``config``, ``metrics_urls``, ``metrics_tls``), and stop what was started on exit.

    Raises:
        typer.Exit: 2 for conflicting options, a bad configuration or a cluster that could not be
            reached or started; 1 for a timeout or a run that failed (a ``RuntimeError``).
    """
    from waltz.local.processes import ServiceStartError
    from waltz.perf.target import LocalClusterSpec, perf_cluster

    if local and (zk or root):
        raise fail("--local starts its own cluster: drop --zookeeper/--root", 2)
    if not secure and not local:
        raise fail("--insecure is for the cluster --local starts: drop it, or add --local", 2)
    spec = LocalClusterSpec(storages, servers, partitions, secure=secure) if local else None
    try:
        with perf_cluster(spec, config_file=config, zookeeper=zk, root=root) as target:
            yield target
    except typer.Exit:
        raise
    except WaltzTimeoutError as exc:
        raise fail(str(exc), 1) from exc
    except (ConfigurationError, ServiceStartError, TimeoutError) as exc:
        raise fail(str(exc), 2) from exc
    except RuntimeError as exc:
        raise fail(str(exc), 1) from exc
    except WaltzError as exc:
        raise fail(str(exc), 2) from exc


def describe_target(local: bool, storages: int, servers: int, partitions: int, root: str) -> str:
    """The cluster in a few words: a local one's shape, or an existing one's root."""
    if local:
        return (
            f"local cluster: {storages} storage node(s), RF {min(3, storages)}, {servers} server(s), "
            f"{partitions} partition(s)"
        )
    return f"cluster {root}"
