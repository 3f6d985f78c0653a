"""A probe of one asyncio loop's callbacks: how long each ran, and how much of that the loop's
thread spent on the CPU.

asyncio's debug mode (``slow_callback_duration``) reports a callback's wall time only. On a
machine with other busy threads in the process, a callback that only sets a future can take
milliseconds of wall time waiting to take the GIL back after a system call; a callback that does
work (or a garbage collection that runs inside it) spends that time on the CPU. The probe records
both, and the cyclic garbage collector's pauses on the loop's thread, so a report can tell
blocking work from waiting (docs/decisions/0064-entity-attempts-off-the-event-loop.md).
"""

from __future__ import annotations

import gc
import threading
import time
from asyncio import events
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SlowCallback:
    """One callback of at least the probe's threshold: wall and loop-thread CPU time (seconds),
    and what it ran (a task's coroutine name, or the handle's repr)."""

    wall: float
    cpu: float
    gc_pause: float
    name: str


@dataclass
class LoopProbeReport:
    """What a probe saw: every callback counted (the longest by wall time, and by CPU time
    outside garbage collection, in seconds), those of ``threshold`` seconds or more kept."""

    threshold: float
    callbacks: int = 0
    longest_wall: float = 0.0
    longest_cpu: float = 0.0
    slow: list[SlowCallback] = field(default_factory=list)
    gc_pauses: list[tuple[int, float]] = field(default_factory=list)

    def working(self) -> list[SlowCallback]:
        """Slow callbacks whose CPU time outside garbage collection reached the threshold. The
        others waited: for the GIL, or in a system call (the probe cannot tell those apart)."""
        return [s for s in self.slow if s.cpu - s.gc_pause >= self.threshold]

    def summary(self) -> str:
        """One line: callbacks, how many reached the threshold by wall time, by CPU time outside
        the collector, and the collector's pauses on the loop's thread."""
        slowest = max(self.slow, key=lambda s: s.wall, default=None)
        working = self.working()
        return (
            f"{self.callbacks} loop callbacks, the longest {self.longest_wall * 1000:.1f} ms of wall"
            f" time, the busiest {self.longest_cpu * 1000:.1f} ms of CPU time;"
            f" {len(self.slow)} of {self.threshold * 1000:g} ms or more by wall time"
            + (f" (the slowest: {slowest.name}, CPU {slowest.cpu * 1000:.1f} ms)" if slowest else "")
            + f"; {len(working)} by CPU time outside garbage collection;"
            f" garbage collections of 1 ms or more on the loop's thread:"
            f" {[(gen, round(pause * 1000, 1)) for gen, pause in self.gc_pauses if pause >= 0.001]}"
        )


def _name(handle: events.Handle) -> str:
    owner = getattr(handle._callback, "__self__", None)
    get_coro = getattr(owner, "get_coro", None)
    if get_coro is not None:
        coro = get_coro()
        return str(getattr(coro, "__qualname__", coro))
    return repr(handle)[:120]


@contextmanager
def loop_probe(threshold: float = 0.005) -> Iterator[LoopProbeReport]:
    """Record the callbacks that asyncio loops on the calling thread run meanwhile.

    Callbacks of other threads' loops (a client's own loop thread) are not counted. The report
    fills in as the loop runs; read it after the block.
    """
    report = LoopProbeReport(threshold)
    thread = threading.get_ident()
    original = events.Handle._run
    collecting: dict[str, float] = {}
    paused = [0.0]

    def run(handle: events.Handle) -> None:
        if threading.get_ident() != thread:
            original(handle)
            return
        paused[0] = 0.0
        wall, cpu = time.perf_counter(), time.thread_time()
        original(handle)
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        report.callbacks += 1
        report.longest_wall = max(report.longest_wall, wall)
        report.longest_cpu = max(report.longest_cpu, cpu - paused[0])
        if wall >= threshold:
            report.slow.append(SlowCallback(wall, cpu, paused[0], _name(handle)))

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if threading.get_ident() != thread:
            return
        if phase == "start":
            collecting["at"] = time.perf_counter()
        elif "at" in collecting:
            pause = time.perf_counter() - collecting.pop("at")
            paused[0] += pause
            report.gc_pauses.append((int(info["generation"]), pause))

    events.Handle._run = run  # type: ignore[method-assign]
    gc.callbacks.append(on_gc)
    try:
        yield report
    finally:
        events.Handle._run = original  # type: ignore[method-assign]
        gc.callbacks.remove(on_gc)
