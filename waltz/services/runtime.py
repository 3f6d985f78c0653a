"""Process-wide runtime settings of the long-running services (storage nodes, servers)."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Protocol

from waltz.tuning import tune_garbage_collector

__all__ = ["Service", "run_until_signalled", "tune_garbage_collector"]

log = logging.getLogger(__name__)


class Service(Protocol):
    """A long-running service with an asynchronous life cycle."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


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
