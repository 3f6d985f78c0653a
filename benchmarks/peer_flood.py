"""What one client-role peer's flood costs a server, and whether other partitions keep answering.

The bounds of docs/design/server.md ("Bounds on what a peer costs"), measured from outside: starts
a LocalCluster (its own ZooKeeper, 3 storage nodes, 1 server, 2 partitions) on loopback, then,
while a prober on a connection of its own asks the server for partition 1's high-water mark every
``--probe-interval`` seconds and times each answer:

1. ``unmounted``: one peer mounted on partition 0 sends ``--flushes`` flush requests, each under a
   client ID of its own that the connection never mounted (the memory attack on per-client state),
   in messages of ``--per-message``, reading its answers;
2. ``mounted``: the same peer sends ``--flushes`` flushes under its own mounted client ID;
3. ``lock hashes``: the peer sends one append carrying ``--hashes`` write lock hashes (about 4
   bytes each on the wire: 5,000,000 is a ~20 MB message, under the 32 MiB message limit).

The server's resident memory (``VmRSS``) is sampled every 0.1 s. Printed per phase: its duration,
the answers the peer got, the prober's answers (median, 99th percentile and maximum round trip)
and the server's memory (before, peak, and after the peer's stream closed).

The bounds are stated before the run: the server's memory stays within ``--memory-bound-mib``
above its start (peak) and within ``--settled-bound-mib`` after the stream closes; every probe
is answered within ``--latency-bound-ms``. Exits with 1 when a bound is broken; the figures are
printed either way.

    .venv/bin/python -m benchmarks.peer_flood                         # 1,000,000 flushes, 5,000,000 hashes
    .venv/bin/python -m benchmarks.peer_flood --flushes 100000 --hashes 500000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from waltz.local.cluster import LocalCluster
from waltz.local.options import SecurityOptions
from waltz.protocol import client_pb2, client_pb2_grpc, common_pb2
from waltz.protocol.channels import channel_options
from waltz.protocol.records import crc32

#: The protocol's figures, comparable with the earlier runs: plaintext, on purpose (what TLS
#: costs: benchmarks/tls_cost.py; decision 0065).
PLAINTEXT = SecurityOptions.plaintext()


def resident_mib(pid: int) -> float:
    """A process's resident memory in MiB (``VmRSS`` of /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


@dataclass
class Phase:
    """One phase's figures."""

    name: str
    seconds: float = 0.0
    sent: int = 0
    answers: int = 0
    errors: int = 0
    probes_ms: list[float] = field(default_factory=list)
    #: (seconds since the phase began, round trip ms) of each probe sent in the phase
    probe_times: list[tuple[float, float]] = field(default_factory=list)
    began: float = field(default_factory=time.monotonic)
    ended: float = float("inf")
    peak_mib: float = 0.0

    def summary(self, baseline: float) -> dict[str, Any]:
        """The phase's figures as JSON values; memory as growth over ``baseline`` MiB."""
        probes = sorted(self.probes_ms)
        p99 = probes[min(len(probes) - 1, int(len(probes) * 0.99))] if probes else float("nan")
        return {
            "phase": self.name,
            "seconds": round(self.seconds, 2),
            "requests_sent": self.sent,
            "answers": self.answers,
            "errors": self.errors,
            "probes": len(probes),
            "probe_median_ms": round(statistics.median(probes), 2) if probes else None,
            "probe_p99_ms": round(p99, 2) if probes else None,
            "probe_max_ms": round(probes[-1], 2) if probes else None,
            "peak_growth_mib": round(self.peak_mib - baseline, 1),
            # the three slowest probes: (seconds after the phase began, round trip ms)
            "slowest_probes": sorted(self.probe_times, key=lambda probe: -probe[1])[:3],
        }


class Stream:
    """One bidirectional client stream of raw protocol messages (docs/protocol.md)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.outgoing: asyncio.Queue[client_pb2.ClientMessages | None] = asyncio.Queue(maxsize=4)
        self.call = client_pb2_grpc.WaltzServerServiceStub(channel).Stream(self._requests())
        self.answers: asyncio.Queue[client_pb2.ServerMessage] = asyncio.Queue()
        self.received = 0

    async def _requests(self) -> AsyncIterator[client_pb2.ClientMessages]:
        while (batch := await self.outgoing.get()) is not None:
            yield batch

    async def send(self, *messages: client_pb2.ClientMessage) -> None:
        """Send ``messages`` as one stream message (waits while 4 are queued)."""
        await self.outgoing.put(client_pb2.ClientMessages(messages=list(messages)))

    async def read_into(self, phase_of: list[Phase], own_client_id: int) -> None:
        """Count every answer into the current phase (``phase_of[0]``) and ``received``; keep the
        answers other than flushes and refusals of other client IDs in ``answers``."""
        async for batch in self.call:
            for message in batch.messages:
                kind = message.WhichOneof("body")
                phase = phase_of[0]
                self.received += 1
                if kind == "error":
                    phase.errors += 1
                    if message.error.req_id.client_id not in (own_client_id, 0):
                        continue  # a flush under a client ID not mounted (0: a message refused whole)
                else:
                    phase.answers += 1
                if kind != "flush":
                    await self.answers.put(message)

    async def close(self) -> None:
        """End the stream and cancel the call."""
        await self.outgoing.put(None)
        self.call.cancel()


def req_id(client_id: int, generation: int, partition_id: int, seq: int) -> common_pb2.ReqId:
    """The ReqId of a request."""
    return common_pb2.ReqId(
        client_id=client_id, generation=generation, partition_id=partition_id, seq_num=seq
    )


async def mount(stream: Stream, client_id: int, generation: int, partition_id: int) -> None:
    """Mount ``partition_id`` under ``client_id`` at high-water mark -1; raises when not ready."""
    await stream.send(
        client_pb2.ClientMessage(
            mount=client_pb2.MountRequest(
                req_id=req_id(client_id, generation, partition_id, 1), client_high_water_mark=-1, seq_num=1
            )
        )
    )
    answer = await asyncio.wait_for(stream.answers.get(), 60)
    if answer.WhichOneof("body") != "mount" or not answer.mount.partition_ready:
        raise RuntimeError(f"mount of partition {partition_id} refused: {answer}")


async def probe(
    endpoint: str, generation: int, interval: float, stop: Any, last_sent: Any
) -> list[tuple[float, float]]:
    """Ask for partition 1's high-water mark every ``interval`` seconds until ``stop`` (a
    :class:`multiprocessing.Event`) is set; returns (``time.monotonic()`` when sent, round trip
    ms) of each probe. ``last_sent`` (a shared double) holds when the last answered probe was
    sent, for the flood to wait on."""
    probes: list[tuple[float, float]] = []
    async with grpc.aio.insecure_channel(endpoint, options=channel_options()) as channel:
        stream = Stream(channel)
        reader = asyncio.ensure_future(stream.read_into([Phase("probe")], 1))
        try:
            try:
                await mount(stream, 1, generation, 1)
            except TimeoutError as exc:
                # Which side stalled: a channel still connecting is this process's, a ready one the
                # server's.
                state = channel.get_state(try_to_connect=False).name
                message = f"the prober's mount of partition 1 was not answered (channel {state})"
                raise RuntimeError(message) from exc
            seq = 1
            while not stop.is_set():
                seq += 1
                sent = time.monotonic()
                await stream.send(
                    client_pb2.ClientMessage(
                        high_water_mark=client_pb2.HighWaterMarkRequest(req_id=req_id(1, generation, 1, seq))
                    )
                )
                answer = await asyncio.wait_for(stream.answers.get(), 120)
                if answer.WhichOneof("body") != "high_water_mark":
                    raise RuntimeError(f"the prober got {answer}")
                probes.append((sent, (time.monotonic() - sent) * 1000))
                last_sent.value = sent
                await asyncio.sleep(interval)
        finally:
            await stream.close()
            reader.cancel()
    return probes


def probe_process(
    endpoint: str, generation: int, interval: float, stop: Any, last_sent: Any, results: Any
) -> None:
    """The prober, in a process of its own (the flooding peer's work must not delay its probes):
    sends its probes through ``results`` (a pipe's end) when ``stop`` is set."""
    results.send(asyncio.run(probe(endpoint, generation, interval, stop, last_sent)))


async def probed_since(last_sent: Any, since: float, timeout: float) -> None:
    """Wait until the prober has had a probe answered that it sent at ``since`` or later, so that
    a phase holds at least one probe however slowly a loaded machine starts or schedules the
    prober; RuntimeError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while last_sent.value < since:
        if time.monotonic() >= deadline:
            raise RuntimeError(f"the prober had no probe answered within {timeout:g} s")
        await asyncio.sleep(0.02)


async def sample_memory(pid: int, phase_of: list[Phase], stop: asyncio.Event) -> None:
    """Keep the current phase's peak of the process's resident memory, every 0.1 s until ``stop``."""
    while not stop.is_set():
        phase = phase_of[0]
        phase.peak_mib = max(phase.peak_mib, resident_mib(pid))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.1)


async def wait_received(stream: Stream, expected: int, timeout: float) -> None:
    """Wait until the stream got ``expected`` answers in all (each flush gets one) or ``timeout``."""
    deadline = time.monotonic() + timeout
    while stream.received < expected and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


async def flood(args: argparse.Namespace, endpoint: str, generation: int, server_pid: int) -> dict[str, Any]:
    """Run the phases against the server at ``endpoint``; returns the figures (JSON values)."""
    phases = [Phase("idle"), Phase("unmounted"), Phase("mounted"), Phase("lock hashes"), Phase("closed")]
    current = [phases[0]]
    stop = asyncio.Event()
    baseline = resident_mib(server_pid)
    phases[0].peak_mib = baseline

    def begin(phase: Phase) -> None:
        # Sampled once at once: a phase shorter than the sampler's 0.1 s still has a peak.
        phase.began = time.monotonic()
        phase.peak_mib = resident_mib(server_pid)
        current[0] = phase

    sampler = asyncio.ensure_future(sample_memory(server_pid, current, stop))
    # Spawned, not forked: this process already ran gRPC (the cluster's readiness probes), and a
    # child forked from it may hang on its first call (gRPC Python supports fork only with its
    # fork support turned on), so the prober's mount would never be answered.
    context = multiprocessing.get_context("spawn")
    probes_wanted, probes_sent = context.Pipe(duplex=False)
    stop_probing = context.Event()
    last_probe_sent = context.Value("d", 0.0)
    prober = context.Process(
        target=probe_process,
        args=(endpoint, generation, args.probe_interval, stop_probing, last_probe_sent, probes_sent),
        name="prober",
    )
    prober.start()
    await asyncio.sleep(2)
    await probed_since(last_probe_sent, phases[0].began, args.timeout)  # the idle phase has its probes
    peer_id, seq = 10, 1
    async with grpc.aio.insecure_channel(endpoint, options=channel_options()) as channel:
        stream = Stream(channel)
        reader = asyncio.ensure_future(stream.read_into(current, peer_id))
        await mount(stream, peer_id, generation, 0)
        sent_in_all = stream.received  # the mount's answer
        for phase in phases[1:3]:
            begin(phase)
            started = time.monotonic()
            for first in range(0, args.flushes, args.per_message):
                count = min(args.per_message, args.flushes - first)
                messages = []
                for i in range(count):
                    seq += 1
                    client_id = 1_000_000 + first + i if phase.name == "unmounted" else peer_id
                    messages.append(
                        client_pb2.ClientMessage(
                            flush=client_pb2.FlushRequest(req_id=req_id(client_id, generation, 0, seq))
                        )
                    )
                await stream.send(*messages)
                phase.sent += count
            sent_in_all += phase.sent
            await wait_received(stream, sent_in_all, args.timeout)
            phase.seconds = time.monotonic() - started
            print(
                f"{phase.name}: {phase.sent:,} flushes sent, {phase.answers:,} answers, "
                f"{phase.errors:,} errors, {phase.seconds:.1f}s",
                flush=True,
            )
        phase = phases[3]
        begin(phase)
        started = time.monotonic()
        seq += 1
        data = b"an append with many lock hashes"
        await stream.send(
            client_pb2.ClientMessage(
                appends=client_pb2.AppendRequests(
                    client_id=peer_id,
                    generation=generation,
                    partition_id=0,
                    seq_nums=[seq],
                    client_high_water_marks=[-1],
                    headers=[0],
                    data=[data],
                    checksums=[crc32(data)],
                    write_lock_counts=[args.hashes],
                    write_lock_hashes=range(args.hashes),
                )
            )
        )
        phase.sent = 1
        refusal = await asyncio.wait_for(stream.answers.get(), args.timeout)
        if refusal.WhichOneof("body") != "error" or refusal.error.req_id.seq_num not in (0, seq):
            raise RuntimeError(f"the append of {args.hashes:,} lock hashes was answered with {refusal}")
        phase.seconds = time.monotonic() - started
        print(
            f"{phase.name}: one append of {args.hashes:,} hashes refused in {phase.seconds:.1f}s "
            f"({refusal.error.message})",
            flush=True,
        )
        begin(phases[4])
        await stream.close()
        reader.cancel()
    await asyncio.sleep(args.settle)
    await probed_since(last_probe_sent, phases[-1].began, args.timeout)  # and so has the closed one
    settled = resident_mib(server_pid)
    for phase, following in itertools.pairwise(phases):
        phase.ended = following.began
    phases[-1].ended = time.monotonic()
    stop.set()
    stop_probing.set()
    await sampler
    if not probes_wanted.poll(60):
        raise RuntimeError("the prober sent no probes within 60 s of the end")
    for sent, took in probes_wanted.recv():
        for phase in phases:
            if phase.began <= sent < phase.ended:
                phase.probes_ms.append(took)
                phase.probe_times.append((round(sent - phase.began, 3), round(took, 2)))
    prober.join(30)
    return {
        "server_rss_start_mib": round(baseline, 1),
        "server_rss_settled_mib": round(settled, 1),
        "phases": [phase.summary(baseline) for phase in phases],
    }


def main() -> None:
    """Parse the command line (``--help``), run the flood and print its figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--flushes", type=int, default=1_000_000, help="flushes per flush phase")
    parser.add_argument("--per-message", type=int, default=10_000, help="flushes per stream message")
    parser.add_argument("--hashes", type=int, default=5_000_000, help="lock hashes in the one append")
    parser.add_argument("--probe-interval", type=float, default=0.02, help="seconds between probes")
    parser.add_argument("--memory-bound-mib", type=float, default=256.0)
    parser.add_argument("--settled-bound-mib", type=float, default=64.0)
    parser.add_argument("--latency-bound-ms", type=float, default=100.0)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds after the stream closes")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for a phase's answers")
    parser.add_argument("--json", dest="json_output", help="write the figures to this file as JSON")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    print(
        f"bounds: server memory +{args.memory_bound_mib:.0f} MiB at peak, +{args.settled_bound_mib:.0f} MiB "
        f"after the stream closes; every probe of partition 1 within {args.latency_bound_ms:.0f} ms",
        flush=True,
    )
    with (
        tempfile.TemporaryDirectory(prefix="waltz-bench-flood-") as tmp,
        LocalCluster(security=PLAINTEXT, storages=3, servers=1, partitions=2, work_dir=Path(tmp)) as cluster,
    ):
        owners = cluster.wait_ready(120)
        generation = owners[0].generation
        (server_pid,) = [pid for name, pid in cluster.pids().items() if name.startswith("server")]
        figures = asyncio.run(flood(args, cluster.servers[0].endpoint, generation, server_pid))
    broken = []
    for phase in figures["phases"]:
        print(json.dumps(phase))
        if phase["probe_max_ms"] is not None and phase["probe_max_ms"] > args.latency_bound_ms:
            broken.append(f"{phase['phase']}: a probe took {phase['probe_max_ms']} ms")
        if phase["peak_growth_mib"] > args.memory_bound_mib:
            broken.append(f"{phase['phase']}: the server grew {phase['peak_growth_mib']} MiB")
    growth = figures["server_rss_settled_mib"] - figures["server_rss_start_mib"]
    print(
        f"server memory: {figures['server_rss_start_mib']} MiB at start, "
        f"{figures['server_rss_settled_mib']} MiB {args.settle:.0f}s after the stream closed"
    )
    if growth > args.settled_bound_mib:
        broken.append(f"the server kept {growth:.0f} MiB after the stream closed")
    figures["bounds"] = {
        "memory_peak_mib": args.memory_bound_mib,
        "memory_settled_mib": args.settled_bound_mib,
        "probe_ms": args.latency_bound_ms,
    }
    figures["broken"] = broken
    if args.json_output:
        Path(args.json_output).write_text(json.dumps(figures, indent=2) + "\n")
    for line in broken:
        print(f"BOUND BROKEN: {line}")
    sys.exit(1 if broken else 0)


if __name__ == "__main__":
    main()
