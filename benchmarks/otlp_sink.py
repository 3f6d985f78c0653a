"""An OTLP/HTTP trace receiver that counts spans and keeps nothing: the collector of the tracing
overhead runs (docs/decisions/0035-opentelemetry-traces.md).

    .venv/bin/python -m benchmarks.otlp_sink [--port 4318] [--seconds 900]

Listens on 127.0.0.1 (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://127.0.0.1:4318/v1/traces``),
answers every export with success, prints the spans received by name every 10 seconds and at the
end (after --seconds, or Ctrl-C). Needs the waltz-py[tracing] extra (the OTLP protobuf classes).
"""

from __future__ import annotations

import argparse
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

COUNTS: Counter[str] = Counter()
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    """Answers every OTLP/HTTP export with success and counts its spans by name."""

    def do_POST(self) -> None:
        """Count the spans of one ``ExportTraceServiceRequest`` and answer it."""
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
        names = Counter(
            span.name
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        )
        with LOCK:
            COUNTS.update(names)
        answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: object) -> None:
        """Log nothing per request (the counts are printed instead)."""
        pass


def main() -> None:
    """Parse the command line (``--help``), serve until ``--seconds`` pass or Ctrl-C, print the counts."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, default=4318)
    parser.add_argument("--seconds", type=float, default=900.0)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    deadline = time.monotonic() + args.seconds
    try:
        while time.monotonic() < deadline:
            time.sleep(min(10.0, max(0.0, deadline - time.monotonic())))
            with LOCK:
                print(dict(COUNTS), flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        with LOCK:
            print("total", dict(COUNTS), flush=True)


if __name__ == "__main__":
    main()
