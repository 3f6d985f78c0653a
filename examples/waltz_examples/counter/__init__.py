"""The counter example of the Waltz announcement: counters that never go negative.

A plain log cannot enforce "never negative": a service reading the counter from its database may
read a stale value, because the log may hold changes its database has not applied yet. Waltz's
optimistic locking makes the check exact: each change carries the high-water mark its read was
based on, and the server refuses it when the counter was written after that mark. See README.md and
docs/design/overview.md "Why the log is the source of truth".

- :class:`CounterService`: increment, decrement (raising :class:`InsufficientCountError`), get.
- :class:`CounterHttpServer`: the JSON HTTP API.
- :mod:`waltz_examples.counter.models`: the ``counters`` table; :mod:`waltz_examples.counter.transactions`:
  the read-modify-write context and the callbacks that apply it.
- ``python -m waltz_examples.counter``: ``serve``, ``local`` and ``load`` commands.
"""

from waltz_examples.counter.errors import (
    CounterOverflowError,
    CounterRequestTimeoutError,
    CounterServiceError,
    InsufficientCountError,
)
from waltz_examples.counter.http_api import CounterHttpServer
from waltz_examples.counter.models import Counter, create_tables
from waltz_examples.counter.service import CounterService, CounterState, CounterStats, CounterUpdate

__all__ = [
    "Counter",
    "CounterHttpServer",
    "CounterOverflowError",
    "CounterRequestTimeoutError",
    "CounterService",
    "CounterServiceError",
    "CounterState",
    "CounterStats",
    "CounterUpdate",
    "InsufficientCountError",
    "create_tables",
]
