"""A node process whose graceful stop hangs still exits within its bound (the watchdog).

docs/design/server.md, "Stopping within a bound".
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from waltz.local.processes import wait_until
from waltz.services.runtime import STOP_TIMEOUT_EXIT_CODE

SCRIPT = """
import asyncio, sys, threading
from waltz.services.runtime import run_until_signalled

class Hangs:
    async def start(self):
        print("started", flush=True)

    async def stop(self):
        # A call that never returns on an executor thread: asyncio.run's shutdown and the
        # interpreter's exit would both wait for it.
        await asyncio.to_thread(threading.Event().wait)

run_until_signalled(Hangs(), stop_bound=1.0)
"""


def test_a_stop_that_hangs_ends_with_the_watchdog_status(tmp_path: Path) -> None:
    out = tmp_path / "out.log"
    with out.open("w") as sink:
        process = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "started" in out.read_text(), timeout=30, what="the service to start")
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        returncode = process.wait(timeout=20)
        elapsed = time.monotonic() - signalled
    finally:
        process.kill()
        process.wait()
    assert returncode == STOP_TIMEOUT_EXIT_CODE, out.read_text()
    assert elapsed < 10, f"exited {elapsed:.1f}s after SIGTERM, its bound is 1s"
    assert "did not stop within 1s of the signal" in out.read_text()
