"""The asyncio loop probe of the suite (tests/support/loop_probe.py) tells a callback that works
on the CPU from one that waits, and counts only its own loop's callbacks."""

from __future__ import annotations

import asyncio
import threading
import time

from support.loop_probe import loop_probe


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_the_probe_tells_work_from_waiting_and_counts_its_loop_only() -> None:
    other_loop_ran = threading.Event()

    def other_thread() -> None:
        async def busy() -> None:
            _spin(0.02)
            other_loop_ran.set()

        asyncio.run(busy())

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.call_soon(_spin, 0.02)  # works: 20 ms of CPU
        loop.call_soon(time.sleep, 0.02)  # waits: 20 ms asleep
        await asyncio.sleep(0.01)
        await asyncio.to_thread(other_thread)

    with loop_probe(0.01) as report:
        asyncio.run(main())
    assert other_loop_ran.is_set()
    slow = [s.name.split(" at ")[0] for s in report.slow]
    assert {"<Handle _spin(0.02)", "<Handle sleep(0.02)>"} <= set(slow), report.slow
    # By wall time, this loop's own steps may also wait for the GIL on a loaded machine; nothing
    # of the other thread's loop is counted (its busy step spins 20 ms of CPU).
    assert set(slow) <= {"<Handle _spin(0.02)", "<Handle sleep(0.02)>", f"{main.__qualname__}"}, report.slow
    # By CPU time only the spin is work: the sleep waits, and the other loop's spin is not ours.
    assert [s.name.split(" at ")[0] for s in report.working()] == ["<Handle _spin(0.02)"], report.summary()
    assert report.longest_cpu >= 0.02
    assert report.callbacks >= 3
    assert "1 by CPU time outside garbage collection" in report.summary()
