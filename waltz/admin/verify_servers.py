"""Server checks of ``waltz cluster verify``: membership, partition ownership and generations.

Design: docs/design/zookeeper.md "Generations and store session IDs"; docs/design/server.md
"Cluster manager" (one server per partition, generations bumped on moves).
:func:`probe_servers` does the I/O; :func:`server_checks` is pure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import grpc

from waltz.admin.description import ClusterDescription
from waltz.admin.verify import CheckResult, CheckStatus, status_of
from waltz.metadata.assignment import Member, PartitionAssignment
from waltz.protocol import server_pb2
from waltz.protocol.channels import TlsConfig, tls_settings_hint
from waltz.protocol.server_client import ServerAdminClient

__all__ = ["ServerProbe", "probe_servers", "server_checks"]


@dataclass(frozen=True, slots=True)
class ServerProbe:
    """A live member's answer to a status request (or why there is none)."""

    member: Member
    status: server_pb2.ServerStatusResponse | None
    error: str | None = None


async def _probe(member: Member, timeout: float, tls: TlsConfig | None) -> ServerProbe:
    try:
        async with ServerAdminClient(member.endpoint, tls=tls, timeout=timeout) as client:
            return ServerProbe(member, await asyncio.wait_for(client.status(), timeout))
    except (grpc.aio.AioRpcError, TimeoutError, OSError) as exc:
        if isinstance(exc, grpc.aio.AioRpcError):
            detail = f"{exc.code().name}: {exc.details()}"
            unavailable = exc.code() is grpc.StatusCode.UNAVAILABLE
        else:
            detail, unavailable = repr(exc), True  # refused, reset, or no answer in time
        hint = tls_settings_hint(tls)
        if hint and unavailable:
            detail = f"{detail}; {hint}"
        return ServerProbe(member, None, detail)


async def probe_servers(
    members: Sequence[Member], *, timeout: float, tls: TlsConfig | None = None
) -> list[ServerProbe]:
    """Ask every live member for its status, concurrently, each within ``timeout`` seconds."""
    return list(await asyncio.gather(*(_probe(m, timeout, tls) for m in members)))


def server_checks(
    description: ClusterDescription, assignment: PartitionAssignment, probes: Sequence[ServerProbe]
) -> list[CheckResult]:
    """Check servers against ZooKeeper: live members answer, each partition has one writable owner.

    Args:
        description: the cluster's metadata (partition generations).
        assignment: ``server/assignment``.
        probes: every live member's status (:func:`probe_servers`).
    """
    if not probes:
        # Storage can be checked without servers (e.g. right after `waltz cluster create`).
        return [
            CheckResult(
                "servers: live members", CheckStatus.WARNING, "no server runs: nothing serves clients"
            )
        ]
    checks = [
        CheckResult("servers: live members", CheckStatus.PASSED, ", ".join(p.member.name for p in probes))
    ]
    by_name: Mapping[str, ServerProbe] = {p.member.name: p for p in probes}
    for probe in probes:
        checks.append(
            CheckResult(
                f"server {probe.member.name} ({probe.member.endpoint}): reachable",
                status_of(probe.status is None),
                probe.error or f"serves {len(probe.status.partitions) if probe.status else 0} partition(s)",
            )
        )
    owners: dict[int, list[str]] = {}
    for probe in probes:
        for served in probe.status.partitions if probe.status else ():
            owners.setdefault(served.partition_id, []).append(probe.member.name)
    for info in description.partitions:
        pid = info.partition_id
        prefix = f"partition {pid}"
        placement = assignment.placements.get(pid)
        if placement is None or placement.member is None or placement.member not in by_name:
            checks.append(
                CheckResult(
                    f"{prefix}: placed on a live server",
                    CheckStatus.FAILED,
                    f"placed on {placement.member if placement else 'nothing'}, which is not a live member",
                )
            )
            continue
        checks.append(CheckResult(f"{prefix}: placed on a live server", CheckStatus.PASSED, placement.member))
        stored = info.metadata.generation if info.metadata else -1
        checks.append(
            CheckResult(
                f"{prefix}: generation",
                status_of(stored > placement.generation),
                f"assignment generation {placement.generation}, store generation {stored}"
                + (" (the store is ahead of the assignment)" if stored > placement.generation else ""),
            )
        )
        claimed = owners.get(pid, [])
        checks.append(
            CheckResult(
                f"{prefix}: exactly one server serves it",
                status_of(claimed != [placement.member] and len(claimed) != 1),
                f"served by {', '.join(claimed) or 'no server'}; assigned to {placement.member}",
            )
        )
        owner = by_name[placement.member].status
        state = next((p for p in owner.partitions if p.partition_id == pid), None) if owner else None
        writable = state is not None and state.writable and state.generation == placement.generation
        checks.append(
            CheckResult(
                f"{prefix}: writable",
                status_of(not writable),
                "no status from its server"
                if state is None
                else f"generation {state.generation}, high-water mark {state.high_water_mark}, "
                f"replicas in session: {', '.join(state.replicas_in_session) or 'none'}"
                + ("" if writable else " (not writable: recovering, or waiting for storage nodes)"),
            )
        )
    return checks
