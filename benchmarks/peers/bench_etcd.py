"""etcd peer: a 3-node etcd cluster (Debian's ``etcd-server``) on loopback, driven by the load generator.

Each transaction is one etcd ``Txn`` on the key ``lock/<id>``: compare the key's mod revision
with the writer's last-seen revision of that key, and put the 200-byte payload if equal; if not,
the failure branch reads the key, the writer records its mod revision, and retries (a retry).
The client is gRPC directly (``etcd_kv.proto``, compiled at start with grpcio-tools): one channel
per node, requests spread round-robin, futures (no thread per request). etcd's own settings are
its defaults (WAL fsync on every Raft batch, heartbeat 100 ms, election 1000 ms, snapshot count
100,000), recorded with the figures.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
from common import MAX_RETRIES, TooManyRetriesError, result

from waltz.local.processes import ManagedProcess, free_port, wait_until
from waltz.perf.loadgen import LoadSpec, Outcome, Request, run_load

ETCD = shutil.which("etcd") or "/usr/bin/etcd"
SETTINGS = "etcd 3.4 defaults: WAL fsync per Raft batch, heartbeat 100 ms, election 1000 ms; gRPC client"


def compile_proto(out_dir: Path) -> ModuleType:
    """Compile ``etcd_kv.proto`` into ``out_dir`` and import it.

    Raises:
        RuntimeError: protoc failed.
    """
    from grpc_tools import protoc

    here = Path(__file__).resolve().parent
    code = protoc.main(["protoc", f"-I{here}", f"--python_out={out_dir}", str(here / "etcd_kv.proto")])
    if code != 0:
        raise RuntimeError(f"protoc failed on etcd_kv.proto (exit code {code})")
    sys.path.insert(0, str(out_dir))
    return importlib.import_module("etcd_kv_pb2")


@contextlib.contextmanager
def etcd_cluster(work: Path, nodes: int = 3) -> Iterator[list[str]]:
    """Start ``nodes`` etcd members on free loopback ports; yield their client endpoints; stop them."""
    clients = [free_port() for _ in range(nodes)]
    peers = [free_port() for _ in range(nodes)]
    initial = ",".join(f"n{i}=http://127.0.0.1:{peers[i]}" for i in range(nodes))
    processes = []
    try:
        for i in range(nodes):
            args = [
                ETCD,
                "--name", f"n{i}",
                "--data-dir", str(work / f"n{i}"),
                "--listen-client-urls", f"http://127.0.0.1:{clients[i]}",
                "--advertise-client-urls", f"http://127.0.0.1:{clients[i]}",
                "--listen-peer-urls", f"http://127.0.0.1:{peers[i]}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{peers[i]}",
                "--initial-cluster", initial,
                "--initial-cluster-state", "new",
                "--initial-cluster-token", f"waltz-peer-{work.name}",
                "--log-level", "warn",
            ]  # fmt: skip
            process = ManagedProcess(args, name=f"etcd-{i}", log_path=work / f"etcd-{i}.log")
            process.start()
            processes.append(process)
        yield [f"127.0.0.1:{port}" for port in clients]
    finally:
        for process in processes:
            process.terminate(10)
            process.close()


def etcd_submitter(
    pb: ModuleType, endpoints: list[str], timeout: float
) -> tuple[Callable[..., None], Callable[[], None]]:
    """A submitter running mod-revision-checked Txns, and a function that closes its channels."""
    channels = [grpc.insecure_channel(e) for e in endpoints]
    txns = [
        c.unary_unary(
            "/etcdserverpb.KV/Txn",
            request_serializer=pb.TxnRequest.SerializeToString,
            response_deserializer=pb.TxnResponse.FromString,
        )
        for c in channels
    ]
    next_channel = itertools.cycle(range(len(txns)))
    seen: dict[int, int] = {}  # lock ID -> last-seen mod revision (0: key absent)
    lock = threading.Lock()

    def attempt(request: Request, done: Callable[[Outcome], None], retries: int) -> None:
        key = f"lock/{request.lock_id}".encode()
        with lock:
            revision = seen.get(request.lock_id or 0, 0)
            channel = next(next_channel)
        txn = pb.TxnRequest(
            compare=[
                pb.Compare(result=pb.Compare.EQUAL, target=pb.Compare.MOD, key=key, mod_revision=revision)
            ],
            success=[pb.RequestOp(request_put=pb.PutRequest(key=key, value=request.payload))],
            failure=[pb.RequestOp(request_range=pb.RangeRequest(key=key))],
        )
        try:
            future = txns[channel].future(txn, timeout=timeout)
        except ValueError as exc:  # the channel was closed (the run is stopping)
            done(Outcome(retries, exc))
            return

        def ended(f: Any) -> None:
            try:
                response = f.result()
            except grpc.RpcError as exc:
                done(Outcome(retries, exc))
                return
            if response.succeeded:
                with lock:
                    seen[request.lock_id or 0] = max(
                        seen.get(request.lock_id or 0, 0), response.header.revision
                    )
                done(Outcome(retries))
                return
            kvs = response.responses[0].response_range.kvs
            with lock:
                seen[request.lock_id or 0] = kvs[0].mod_revision if kvs else 0
            if retries + 1 >= MAX_RETRIES:
                done(
                    Outcome(
                        retries + 1, TooManyRetriesError(f"lock {request.lock_id}: {MAX_RETRIES} conflicts")
                    )
                )
                return
            attempt(request, done, retries + 1)

        future.add_done_callback(ended)

    def submit(request: Request, done: Callable[[Outcome], None]) -> None:
        attempt(request, done, 0)

    def close() -> None:
        for c in channels:
            c.close()

    return submit, close


def run(spec: LoadSpec, warmup: int = 500) -> dict[str, Any]:
    """Start a 3-node etcd cluster, run the load, stop it; the result row."""
    work = Path(tempfile.mkdtemp(prefix="waltz-peer-etcd-"))
    try:
        pb = compile_proto(work)
        with etcd_cluster(work) as endpoints:
            probe = grpc.insecure_channel(endpoints[0])
            put = probe.unary_unary(
                "/etcdserverpb.KV/Put",
                request_serializer=pb.PutRequest.SerializeToString,
                response_deserializer=pb.PutResponse.FromString,
            )

            def ready() -> bool:
                try:
                    put(pb.PutRequest(key=b"ready", value=b"1"), timeout=2)
                    return True
                except grpc.RpcError:
                    return False

            wait_until(ready, timeout=60, what="the etcd cluster to accept a put", interval=0.2)
            probe.close()
            submit, close = etcd_submitter(pb, endpoints, timeout=spec.timeout)
            try:
                run_load(submit, LoadSpec(warmup, spec.payload_size, spec.lock_pool_size, spec.max_in_flight))
                stats = run_load(submit, spec)
            finally:
                close()
        return result("etcd", "3 nodes (Raft), loopback", SETTINGS, spec, stats)
    finally:
        shutil.rmtree(work, ignore_errors=True)
