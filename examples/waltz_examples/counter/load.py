"""A load generator for the counter HTTP API (``python -m waltz_examples.counter load``).

Threads send random increments and decrements to a few counters over kept-alive HTTP/1.1
connections (``http.client``), and the report gives the request rate, the answers by status (409:
a decrement refused because the counter would have gone negative), and latency percentiles
computed exactly from every request's duration (``statistics.quantiles``).

With ``check`` the generator also verifies what the service promises: it reads each counter
before and after the run (``?consistent=true``), and each final value must equal the initial one
plus the increments minus the decrements that were answered 200; no answer may show a negative
value. This holds only while nothing else changes those counters.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import random
import statistics
import threading
import time
from collections import Counter as Tally
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

__all__ = ["ConsistencyCheck", "LoadReport", "run_load"]


@dataclass(frozen=True, slots=True)
class ConsistencyCheck:
    """The before/after comparison of a load run.

    Attributes:
        initial: counter -> value before the run.
        final: counter -> value after the run.
        expected: counter -> initial value + the changes answered 200.
        lowest_seen: the lowest value any answer showed (None: no answer carried one).
    """

    initial: Mapping[int, int]
    final: Mapping[int, int]
    expected: Mapping[int, int]
    lowest_seen: int | None

    @property
    def mismatches(self) -> dict[int, tuple[int, int]]:
        """Counter -> (final, expected) for each counter whose final value is not the expected one."""
        return {
            c: (self.final.get(c, 0), expected)
            for c, expected in self.expected.items()
            if self.final.get(c) != expected
        }

    @property
    def ok(self) -> bool:
        """Every final value is the expected one, and no answer showed a negative value."""
        return not self.mismatches and (self.lowest_seen is None or self.lowest_seen >= 0)

    def describe(self) -> str:
        """One line for people: the verdict, and the first mismatches if any."""
        lowest = "none" if self.lowest_seen is None else str(self.lowest_seen)
        if self.ok:
            return (
                f"OK: {len(self.final)} counters moved from a total of {sum(self.initial.values())} to "
                f"{sum(self.final.values())}, exactly as the answers said; lowest value seen {lowest}"
            )
        wrong = ", ".join(
            f"counter {c}: {final} instead of {expected}"
            for c, (final, expected) in sorted(self.mismatches.items())[:10]
        )
        return (
            f"FAILED: {len(self.mismatches)} counter(s) differ from initial + answered changes "
            f"({wrong or 'none'}); lowest value seen {lowest}"
        )


@dataclass(frozen=True, slots=True)
class LoadReport:
    """The outcome of a load run.

    Attributes:
        requests: requests sent.
        elapsed: seconds from the first request to the last answer.
        statuses: HTTP status -> number of answers.
        transport_errors: requests that got no HTTP answer (connection refused or reset).
        latencies: seconds each answered request took, in completion order per thread.
        check: the consistency check, or None when it was not asked for.
        first_errors: the first few unexpected answers or errors, for the report.
    """

    requests: int
    elapsed: float
    statuses: Mapping[int, int]
    transport_errors: int
    latencies: tuple[float, ...]
    check: ConsistencyCheck | None
    first_errors: tuple[str, ...] = field(default=())

    @property
    def requests_per_second(self) -> float:
        """Answered requests per second."""
        answered = sum(self.statuses.values())
        return answered / self.elapsed if self.elapsed > 0 else 0.0

    def percentile(self, percent: int) -> float:
        """A latency percentile in seconds (1..99; the maximum for 100), 0.0 without answers.

        Raises:
            ValueError: ``percent`` is not in 1..100.
        """
        if not 1 <= percent <= 100:
            raise ValueError(f"percentile {percent} is not in 1..100")
        if not self.latencies:
            return 0.0
        if percent == 100 or len(self.latencies) == 1:
            return max(self.latencies)
        return statistics.quantiles(self.latencies, n=100, method="inclusive")[percent - 1]

    def describe(self) -> str:
        """The report as lines of text, for people."""
        statuses = ", ".join(f"{status}: {count}" for status, count in sorted(self.statuses.items()))
        lines = [
            f"requests      {self.requests} in {self.elapsed:.2f}s "
            f"= {self.requests_per_second:,.0f} requests/s",
            f"answers       {statuses or 'none'}; transport errors: {self.transport_errors}",
            f"409 refused   {self.statuses.get(409, 0)} (decrements that would have gone negative)",
            "latency       p50 {:.1f} ms, p90 {:.1f} ms, p99 {:.1f} ms, max {:.1f} ms".format(
                *(1000 * self.percentile(p) for p in (50, 90, 99, 100))
            ),
        ]
        if self.check is not None:
            lines.append(f"consistency   {self.check.describe()}")
        lines += [f"error         {error}" for error in self.first_errors]
        return "\n".join(lines)


class _Client:
    """One kept-alive connection to the API (one per thread)."""

    def __init__(self, url: str, timeout: float) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the API URL must look like http://host:port, got {url!r}")
        self._host = parts.hostname
        self._port = parts.port or 80
        self._timeout = timeout
        self._connection: http.client.HTTPConnection | None = None

    def request(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]]:
        """Send one request; returns the status and the decoded JSON answer.

        Raises:
            OSError, http.client.HTTPException: no answer (the connection is dropped).
        """
        if self._connection is None:
            self._connection = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        data = None if body is None else json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json"} if data is not None else {}
        try:
            self._connection.request(method, path, body=data, headers=headers)
            response = self._connection.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        if response.will_close:
            self.close()
        answer = json.loads(raw) if raw else {}
        return response.status, answer if isinstance(answer, dict) else {"answer": answer}

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def _read_counters(url: str, counter_ids: list[int], concurrency: int, timeout: float) -> dict[int, int]:
    """Every counter's value, read with ``consistent=true`` from ``concurrency`` threads."""
    local = threading.local()
    clients: list[_Client] = []
    clients_lock = threading.Lock()

    def read(counter_id: int) -> int:
        client: _Client | None = getattr(local, "client", None)
        if client is None:
            client = local.client = _Client(url, timeout)
            with clients_lock:
                clients.append(client)
        status, answer = client.request("GET", f"/counters/{counter_id}?consistent=true")
        if status != 200:
            raise RuntimeError(f"GET /counters/{counter_id} answered {status}: {answer.get('error', answer)}")
        return int(answer["value"])

    try:
        with concurrent.futures.ThreadPoolExecutor(concurrency, thread_name_prefix="load-read") as pool:
            return dict(zip(counter_ids, pool.map(read, counter_ids), strict=True))
    finally:
        for client in clients:
            client.close()


def run_load(
    url: str,
    *,
    requests: int,
    concurrency: int,
    counters: int,
    decrement_ratio: float,
    max_amount: int = 10,
    first_counter: int = 1,
    seed: int | None = None,
    timeout: float = 60.0,
    check: bool = True,
) -> LoadReport:
    """Send ``requests`` random changes from ``concurrency`` threads and report on them.

    Args:
        url: the API's base URL, e.g. ``http://127.0.0.1:8080``.
        requests: how many changes to send in all (at least 1).
        concurrency: threads, each with its own connection (at least 1).
        counters: counters ``first_counter .. first_counter + counters - 1`` receive the changes.
        decrement_ratio: the share of decrements, 0..1.
        max_amount: amounts are drawn uniformly from 1..max_amount.
        first_counter: the first counter's ID.
        seed: seeds the random plan (None: a random one).
        timeout: seconds one request may take.
        check: read the counters before and after and compare (see the module docstring).

    Returns:
        The report (print :meth:`LoadReport.describe`).

    Raises:
        ValueError: an argument is out of range.
        RuntimeError: ``check`` and a counter could not be read.
        OSError: ``check`` and the API is unreachable.
    """
    if requests < 1 or concurrency < 1 or counters < 1 or max_amount < 1:
        raise ValueError("requests, concurrency, counters and max_amount must be at least 1")
    if not 0.0 <= decrement_ratio <= 1.0:
        raise ValueError(f"decrement_ratio must be between 0 and 1, got {decrement_ratio}")
    rng = random.Random(seed)
    counter_ids = list(range(first_counter, first_counter + counters))
    plan = [
        (
            rng.choice(counter_ids),
            "decrement" if rng.random() < decrement_ratio else "increment",
            rng.randint(1, max_amount),
        )
        for _ in range(requests)
    ]
    # The URL is checked before any thread starts.
    _Client(url, timeout).close()
    initial = _read_counters(url, counter_ids, concurrency, timeout) if check else {}

    lock = threading.Lock()
    next_index = 0
    statuses: Tally[int] = Tally()
    net: Tally[int] = Tally()
    latencies: list[float] = []
    errors: list[str] = []
    transport_errors = 0
    lowest: list[int] = []

    def worker() -> None:
        nonlocal next_index, transport_errors
        client = _Client(url, timeout)
        mine: list[float] = []
        try:
            for _ in range(requests):  # bounded: at most every request of the plan
                with lock:
                    if next_index >= len(plan):
                        break
                    counter_id, action, amount = plan[next_index]
                    next_index += 1
                started = time.perf_counter()
                try:
                    status, answer = client.request(
                        "POST", f"/counters/{counter_id}/{action}", {"amount": amount}
                    )
                except (OSError, http.client.HTTPException) as exc:
                    with lock:
                        transport_errors += 1
                        if len(errors) < 5:
                            errors.append(f"{action} {counter_id}: no answer ({exc!r})")
                    continue
                mine.append(time.perf_counter() - started)
                value = answer.get("value")
                with lock:
                    statuses[status] += 1
                    if status == 200:
                        net[counter_id] += amount if action == "increment" else -amount
                    elif status != 409 and len(errors) < 5:
                        errors.append(
                            f"{action} {counter_id} by {amount}: {status} {answer.get('error', answer)}"
                        )
                    if isinstance(value, int) and (not lowest or value < lowest[0]):
                        lowest[:] = [value]
        finally:
            client.close()
            with lock:
                latencies.extend(mine)

    threads = [threading.Thread(target=worker, name=f"load-{i}", daemon=True) for i in range(concurrency)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started

    consistency = None
    if check:
        final = _read_counters(url, counter_ids, concurrency, timeout)
        expected = {c: initial[c] + net[c] for c in counter_ids}
        consistency = ConsistencyCheck(initial, final, expected, lowest[0] if lowest else None)
    return LoadReport(
        requests=requests,
        elapsed=elapsed,
        statuses=dict(statuses),
        transport_errors=transport_errors,
        latencies=tuple(latencies),
        check=consistency,
        first_errors=tuple(errors),
    )
