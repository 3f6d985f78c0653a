"""``waltz client``: check a cluster as a client sees it (upstream Waltz's ClientCli).

The logic lives in :mod:`waltz.admin.client_tools`; this module parses options and prints
results. Exit codes: 0 success; 1 a check failed (``validate`` found a transaction whose data is not
its ID or a transaction failed; ``check-connectivity`` found a node that did not answer);
2 bad usage or configuration, ZooKeeper or the cluster unreachable, or a local cluster that did
not start.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from waltz.cli.admin_session import refuse_expired_certificates
from waltz.cli.groups import HELP, MARKUP
from waltz.cli.options import (
    ClientConfigOption,
    JsonOption,
    LocalOption,
    LocalPartitionsOption,
    LocalServersOption,
    LocalStoragesOption,
    PartitionsOption,
    RootOption,
    TlsCaOption,
    TlsCertOption,
    TlsKeyOption,
    ZookeeperOption,
    quiet_logging,
)
from waltz.cli.output import fail
from waltz.cli.partition_ids import parse_partitions
from waltz.errors import ConfigurationError, WaltzError

if TYPE_CHECKING:
    from waltz.client import WaltzClientConfig

app = typer.Typer(help=HELP["client"], no_args_is_help=True, rich_markup_mode=MARKUP)


@contextmanager
def _client_config(
    config: Path | None,
    zookeeper: str | None,
    root: str | None,
    ca_file: Path | None,
    cert_file: Path | None,
    key_file: Path | None,
    *,
    local: bool = False,
    storages: int = 3,
    servers: int = 1,
    partitions: int = 1,
) -> Iterator[WaltzClientConfig]:
    """The cluster's client configuration (a local cluster started for the block with ``local``)."""
    from waltz.local.processes import ServiceStartError
    from waltz.perf.target import LocalClusterSpec, perf_cluster

    quiet_logging()
    if local and (zookeeper or root):
        raise fail("--local starts its own cluster: drop --zookeeper/--root", 2)
    spec = LocalClusterSpec(storages, servers, partitions) if local else None
    tls = {"client_tls_ca_file": ca_file, "client_tls_cert_file": cert_file, "client_tls_key_file": key_file}
    try:
        with perf_cluster(spec, config_file=config, zookeeper=zookeeper, root=root) as target:
            overrides = {k: v for k, v in tls.items() if v is not None}
            client_config = target.config.model_copy(update=overrides) if overrides else target.config
            refuse_expired_certificates(
                client_config.presented_certificates(), "the servers and ZooKeeper", "the client"
            )
            yield client_config
    except typer.Exit:
        raise
    except (ConfigurationError, ServiceStartError) as exc:
        raise fail(str(exc), 2) from exc
    except WaltzError as exc:
        raise fail(str(exc), 2) from exc


def _partition_ids(values: list[str]) -> list[int] | None:
    return parse_partitions(values) or None


@app.command("validate")
def validate(
    producers: Annotated[int, typer.Option("--producers", min=1, help="Producer clients.")] = 2,
    transactions: Annotated[
        int, typer.Option("--transactions", "-n", min=1, help="Transactions each producer submits.")
    ] = 50,
    partition: PartitionsOption = [],  # noqa: B006 (typer reads the default)
    since: Annotated[
        int | None,
        typer.Option(
            "--since",
            min=-1,
            help="Check every transaction after this ID (-1: the whole log); default: only this "
            "run's transactions.",
            show_default=False,
        ),
    ] = None,
    run_timeout: Annotated[
        float,
        typer.Option("--run-timeout", min=1.0, help="Seconds producing and reading back may take, each."),
    ] = 120.0,
    json_output: JsonOption = False,
    config: ClientConfigOption = None,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    ca_file: TlsCaOption = None,
    cert_file: TlsCertOption = None,
    key_file: TlsKeyOption = None,
    local: LocalOption = False,
    storages: LocalStoragesOption = 3,
    servers: LocalServersOption = 1,
    partitions: LocalPartitionsOption = 1,
) -> None:
    """Check serializability: every committed transaction's data must equal its own transaction ID.

    --producers clients each submit --transactions transactions, spread over the chosen partitions
    (--partition, default all). Every transaction takes the same WRITE lock of its partition and
    writes, as its data, the client's high-water mark plus one: the lock lets it commit only if no
    other writer committed after that mark, so its data is its transaction ID. A separate client
    then reads the partitions back through its feed; any transaction whose data is not its ID is
    named and the command exits 1. No other application may write the chosen partitions
    meanwhile. With --local it starts a local cluster for the run.
    """
    from waltz.admin.client_tools import run_validation

    with _client_config(
        config,
        zookeeper,
        root,
        ca_file,
        cert_file,
        key_file,
        local=local,
        storages=storages,
        servers=servers,
        partitions=partitions,
    ) as client_config:
        try:
            report = run_validation(
                client_config,
                producers=producers,
                transactions=transactions,
                partitions=_partition_ids(partition),
                since=since,
                timeout=run_timeout,
            )
        except ValueError as exc:
            raise fail(str(exc), 2) from exc
    if json_output:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        typer.echo(
            f"{report.committed} of {report.submitted} transactions committed by {producers} producer(s) "
            f"on partition(s) {','.join(map(str, report.partitions))}, {report.retries} retries after "
            f"lock failures, in {report.seconds:.1f}s"
        )
        for pid, (first, last) in sorted(report.checked.items()):
            typer.echo(f"partition {pid}: checked transactions {first}..{last}")
        for mismatch in report.mismatches:
            typer.secho(f"MISMATCH: {mismatch}", fg=typer.colors.RED)
        for error in report.errors:
            typer.secho(f"ERROR: {error}", fg=typer.colors.RED)
        typer.echo("PASSED" if report.passed else "FAILED")
    if not report.passed:
        raise typer.Exit(1)


@app.command("high-water-mark")
def high_water_mark(
    partition: PartitionsOption = [],  # noqa: B006 (typer reads the default)
    json_output: JsonOption = False,
    config: ClientConfigOption = None,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    ca_file: TlsCaOption = None,
    cert_file: TlsCertOption = None,
    key_file: TlsKeyOption = None,
) -> None:
    """Print each partition's high-water mark as a client sees it (asked of the owning server).

    The high-water mark is the ID of the partition's last committed transaction (-1: empty).
    """
    from waltz.admin.client_tools import high_water_marks

    with _client_config(config, zookeeper, root, ca_file, cert_file, key_file) as client_config:
        try:
            marks = high_water_marks(client_config, _partition_ids(partition))
        except ValueError as exc:
            raise fail(str(exc), 2) from exc
    if json_output:
        typer.echo(json.dumps({"high_water_marks": {str(p): m for p, m in sorted(marks.items())}}))
        return
    for pid, mark in sorted(marks.items()):
        typer.echo(f"partition {pid}: {mark}")


@app.command("check-connectivity")
def check_connectivity(
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.1, help="Seconds for ZooKeeper and each node.")
    ] = 5.0,
    json_output: JsonOption = False,
    config: ClientConfigOption = None,
    zookeeper: ZookeeperOption = None,
    root: RootOption = None,
    ca_file: TlsCaOption = None,
    cert_file: TlsCertOption = None,
    key_file: TlsKeyOption = None,
) -> None:
    """Check that every server and storage node answers: OK, or what failed; exit 1 on any failure.

    Servers (the live members in ZooKeeper) are asked for their status on their client port;
    storage nodes (every node in the cluster's znodes) get a connection on their storage port and
    an admin request on their admin port. The TLS files (client.ssl.* or --ssl-*) are used for
    every connection.
    """
    from waltz.admin.client_tools import check_connectivity as check

    with _client_config(config, zookeeper, root, ca_file, cert_file, key_file) as client_config:
        checks = check(client_config, timeout=timeout, storage_tls=client_config.tls())
    if json_output:
        typer.echo(
            json.dumps(
                {
                    "ok": all(c.ok for c in checks),
                    "nodes": [
                        {
                            "kind": c.kind,
                            "name": c.name,
                            "address": c.address,
                            "ok": c.ok,
                            "error": c.error,
                            "detail": c.detail,
                            "skipped": c.skipped,
                        }
                        for c in checks
                    ],
                },
                indent=2,
            )
        )
    else:
        for c in checks:
            label = (
                f"{c.kind:<13} {c.name} ({c.address})" if c.name != c.address else f"{c.kind:<13} {c.address}"
            )
            if c.skipped:
                typer.echo(f"SKIPPED {label}: {c.detail}")
            elif c.ok:
                typer.echo(f"OK      {label}: {c.detail}")
            else:
                typer.secho(f"FAILED  {label}: {c.error}", fg=typer.colors.RED)
        if not checks:
            typer.echo("no server or storage node in the cluster")
    if not all(c.ok for c in checks):
        raise typer.Exit(1)
