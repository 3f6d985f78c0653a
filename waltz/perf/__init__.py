"""Performance tools: ``waltz perf producer`` / ``consumer`` and the shared load generator.

- :mod:`waltz.perf.loadgen`: the load generator (closed loop or Poisson arrivals, a write lock
  from a pool, HdrHistogram latencies), also used by the peer benchmarks in ``benchmarks/peers``.
- :mod:`waltz.perf.producer`: Waltz clients as producers (upstream ProducerPerf).
- :mod:`waltz.perf.consumer`: a client reading what producers wrote (upstream ConsumerPerf).
- :mod:`waltz.perf.stats`: latency histograms and the printed figures.
- :mod:`waltz.perf.target`: an existing cluster, or a local one started for the run.
"""

from __future__ import annotations

from waltz.perf.loadgen import LoadSpec, Outcome, Request, Submitter, run_load
from waltz.perf.stats import PERCENTILES, LatencyHistogram, RunStats

__all__ = [
    "PERCENTILES",
    "LatencyHistogram",
    "LoadSpec",
    "Outcome",
    "Request",
    "RunStats",
    "Submitter",
    "run_load",
]
