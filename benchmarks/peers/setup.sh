#!/usr/bin/env bash
# Install what the peer benchmarks need, idempotently (run scripts/setup first for .venv):
#   - Debian: etcd-server and etcd-client (apt-get, as root or through passwordless sudo). The
#     package starts no daemon here (no systemd); run_all.py starts its own members on loopback.
#   - .venv: eventsourcing[postgres], hdrhistogram, py-spy (profiling).
# PostgreSQL must listen on 127.0.0.1:5432 (user postgres, trust) for the eventsourcing case.
# smallbank-pg-quorum starts servers of its own from PostgreSQL's server binaries (initdb, pg_ctl,
# pg_basebackup; Debian's postgresql package, which also makes the OS user postgres they run as).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
say() { printf 'peers-setup: %s\n' "$*" >&2; }

if [ ! -x .venv/bin/python ]; then
  say ".venv is missing: run scripts/setup first"; exit 1
fi

if ! command -v etcd >/dev/null 2>&1 || ! command -v etcdctl >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then sudo_cmd=(); elif sudo -n true 2>/dev/null; then sudo_cmd=(sudo -n); else
    say "etcd is missing and apt-get needs root: apt-get install -y etcd-server etcd-client"; exit 1
  fi
  say "installing etcd-server etcd-client"
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y etcd-server etcd-client >/dev/null ||
    { "${sudo_cmd[@]}" apt-get update >/dev/null && "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y etcd-server etcd-client >/dev/null; }
fi
say "$(etcd --version | head -1)"

.venv/bin/python -m pip install --quiet 'eventsourcing[postgres]>=9.4,<10' 'hdrhistogram>=0.10,<1' 'py-spy>=0.3'
.venv/bin/python -c 'import eventsourcing, hdrh, grpc_tools' ||
  { say "a Python package is missing (grpcio-tools comes with the dev extra of scripts/setup)"; exit 1; }

if ! .venv/bin/python -c 'import socket; socket.create_connection(("127.0.0.1", 5432), 2).close()' 2>/dev/null; then
  say "warning: nothing listens on 127.0.0.1:5432; the eventsourcing case will be skipped"
fi
say "ready: .venv/bin/python -m benchmarks.peers.run_all --quick"
