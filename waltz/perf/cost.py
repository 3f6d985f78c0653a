"""What a perf run costs in CPU: the cluster processes' CPU seconds, read from their metrics.

Servers and storage nodes export ``process_cpu_seconds_total`` (prometheus-client's process
collector) on ``/metrics``; a run reads it from every node before and after, so that
``waltz perf producer`` can say how many microseconds of CPU each process spent per committed
transaction, beside the client processes' own (``time.process_time`` around the measured phase).
"""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["CPU_METRIC", "measure_node_cpu", "node_cpu_seconds"]

log = logging.getLogger(__name__)

#: The family of prometheus-client's process collector that counts user + system CPU seconds.
CPU_METRIC = "process_cpu_seconds"


def node_cpu_seconds(urls: Mapping[str, str], timeout: float = 5.0) -> dict[str, float]:
    """The CPU seconds each node's process has used so far, from its ``/metrics`` endpoint.

    Args:
        urls: ``/metrics`` URL of each node, by name (``LocalCluster.metrics_urls()``).
        timeout: seconds to wait for each node.

    Returns:
        CPU seconds by node name; a node that does not answer (or answers what does not parse as
        Prometheus text), or exports no ``process_cpu_seconds_total`` (not on Linux), is left out
        with a warning in the log.
    """
    seconds: dict[str, float] = {}
    for name, url in urls.items():
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                text = response.read().decode("utf-8")
        except OSError as exc:
            log.warning("cannot read the metrics of %s at %s: %s", name, url, exc)
            continue
        try:
            value = next(
                (f.samples[0].value for f in text_string_to_metric_families(text) if f.name == CPU_METRIC),
                None,
            )
        except (ValueError, IndexError) as exc:  # not the Prometheus text format
            log.warning("cannot parse the metrics of %s at %s: %s", name, url, exc)
            continue
        if value is None:
            log.warning("%s exports no %s_total at %s", name, CPU_METRIC, url)
        else:
            seconds[name] = float(value)
    return seconds


@contextmanager
def measure_node_cpu(urls: Mapping[str, str]) -> Iterator[dict[str, float]]:
    """Yield a dict that holds, once the block ends, each node's CPU seconds spent during it.

    Nodes missing from either reading (unreachable, restarted in between: the counter went
    down) are left out.
    """
    spent: dict[str, float] = {}
    before = node_cpu_seconds(urls)
    yield spent
    after = node_cpu_seconds(urls)
    for name, value in after.items():
        if name in before and value >= before[name]:
            spent[name] = value - before[name]
