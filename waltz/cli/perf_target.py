"""The cluster a ``waltz perf`` command measures: a local one it starts, or an existing one.

Shared by the commands of :mod:`waltz.cli.perf` and :mod:`waltz.cli.perf_inventory`: the options
``--local``/``--storages``/``--servers``/``--partitions`` or ``--zookeeper``/``--root``/``--config``
become a :func:`waltz.perf.target.perf_cluster`, and its failures the commands' exit codes (1: the
run could not complete; 2: bad options, configuration, or a cluster that could not be reached or
started).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer

from waltz.cli.output import fail
from waltz.errors import ConfigurationError, WaltzError, WaltzTimeoutError

__all__ = ["describe_target", "local_options_given", "perf_target", "run_application_perf"]

#: The options that shape the cluster ``--local`` starts, by parameter name.
LOCAL_CLUSTER_OPTIONS = {"storages": "--storages", "servers": "--servers", "partitions": "--partitions"}


def local_options_given(context: typer.Context) -> tuple[str, ...]:
    """The options of :data:`LOCAL_CLUSTER_OPTIONS` that the command's user gave (on the command
    line or by an environment variable), not left at their defaults, e.g. ``("--partitions",)``.
    """
    given = []
    for name, flag in LOCAL_CLUSTER_OPTIONS.items():
        source = context.get_parameter_source(name)
        if source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT"):
            given.append(flag)
    return tuple(given)


def _refuse_local_options_without_local(local: bool, given: Sequence[str]) -> None:
    """Refuse ``--storages``/``--servers``/``--partitions`` without ``--local``, which alone reads
    them (docs/benchmarks.md "`waltz perf producer` and `waltz perf consumer`").

    Raises:
        typer.Exit: 2, naming the options given, when ``local`` is False and ``given`` is not empty.
    """
    if given and not local:
        options = "/".join(given)
        are, them = ("are", "them") if len(given) > 1 else ("is", "it")
        raise fail(f"{options} {are} for the cluster --local starts: drop {them}, or add --local", 2)


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
    local_options: Sequence[str] = (),
) -> Iterator[Any]:
    """Start a local cluster (``local``) or reach an existing one; yield the target (its client
    ``config``, ``metrics_urls``, ``metrics_tls``), and stop what was started on exit.

    ``local_options`` are the local-cluster options the user gave (:func:`local_options_given`),
    refused without ``local``.

    Raises:
        typer.Exit: 2 for conflicting options (``--storages``/``--servers``/``--partitions`` or
            ``--insecure`` without ``local``, ``--zookeeper``/``--root`` with it), a bad
            configuration or a cluster that could not be reached or started; 1 for a timeout or
            a run that failed (a ``RuntimeError``).
    """
    from waltz.local.processes import ServiceStartError
    from waltz.perf.target import LocalClusterSpec, perf_cluster

    if local and (zk or root):
        raise fail("--local starts its own cluster: drop --zookeeper/--root", 2)
    _refuse_local_options_without_local(local, local_options)
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


def run_application_perf(
    name: str,
    application: Any,
    settings: Any,
    run: Callable[..., Any],
    *,
    db: str | None,
    local: bool,
    storages: int,
    servers: int,
    partitions: int,
    config: Path | None,
    zookeeper: str | None,
    root: str | None,
    secure: bool,
    as_json: bool,
    local_options: Sequence[str] = (),
) -> None:
    """The body of an application run of ``waltz perf`` (``smallbank``, ``inventory``): check the
    database (a temporary SQLite one when ``db`` is None), reach or start the cluster, call
    ``run(client_config, settings, db_url, metrics_urls=, metrics_tls=, say=)``, and print its
    report (``summary()`` as JSON, or ``text()`` after a line naming ``name``, the settings, the
    database and the cluster). ``local_options`` are the local-cluster options the user gave
    (:func:`local_options_given`), refused without ``local``.

    Raises:
        typer.Exit: 2 for conflicting options or an unusable database (and as :func:`perf_target`);
            1 for partition routing with more instances than ``--local``'s partitions (before
            the cluster starts), when the database failed during the run or a check of the
            report failed.
    """
    from sqlalchemy.exc import SQLAlchemyError

    from waltz.workloads.perf import UnusableDatabaseError, check_database, perf_database
    from waltz.workloads.perf.settings import routing_refusal

    if local and (zookeeper or root):
        raise fail("--local starts its own cluster: drop --zookeeper/--root", 2)
    _refuse_local_options_without_local(local, local_options)
    if local and settings.partition_routing:
        # Known from the options: refused before a cluster starts, as a run refuses it later.
        refusal = routing_refusal(settings.instances, partitions)
        if refusal is not None:
            raise fail(f"{refusal} (raise --partitions or lower --instances)", 1)
    say = None if as_json else lambda line: typer.echo(line, err=True)
    with perf_database(application, db) as db_url:
        try:
            check_database(application, db_url, new_log=local, cluster_name=settings.cluster_name)
        except UnusableDatabaseError as exc:
            raise fail(str(exc), 2) from exc
        with perf_target(
            local, storages, servers, partitions, config, zookeeper, root, secure, local_options
        ) as target:
            client_config = target.config
            try:
                report = run(
                    client_config,
                    settings,
                    db_url,
                    metrics_urls=target.metrics_urls,
                    metrics_tls=target.metrics_tls,
                    say=say,
                )
            except SQLAlchemyError as exc:
                raise fail(f"the database failed: {type(exc).__name__}: {exc}", 1) from exc
    if as_json:
        typer.echo(json.dumps(report.summary()))
    else:
        where = describe_target(local, storages, servers, partitions, client_config.cluster_root)
        typer.echo(f"{name}: {settings.describe()}; database {report.database}; {where}")
        typer.echo(report.text())
    if not report.passed:
        raise typer.Exit(1)
