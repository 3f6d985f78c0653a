"""Process-wide runtime settings of the long-running services (storage nodes, servers)."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from typing import Protocol

__all__ = ["Service", "run_until_signalled", "tune_garbage_collector"]

log = logging.getLogger(__name__)


class Service(Protocol):
    """A long-running service with an asynchronous life cycle."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def tune_garbage_collector() -> None:
    """Move start-up objects out of the collector's way and collect young objects less often.

    The append path allocates many short-lived objects; the default thresholds make full
    collections (tens of milliseconds, measured with benchmarks/store_commit.py) frequent enough
    to dominate tail latency. Call once the service has started.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def run_until_signalled(service: Service) -> None:
    """Start ``service``, run until SIGTERM or SIGINT, then stop it gracefully."""

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await service.start()
        tune_garbage_collector()
        try:
            await stop.wait()
            log.info("stopping on signal")
        finally:
            await service.stop()

    asyncio.run(serve())
