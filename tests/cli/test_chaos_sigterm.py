"""SIGTERM (or SIGHUP, its terminal closed) to a ``waltz`` tool that started a local cluster stops
the cluster too.

A 1,000,000-transaction ``waltz chaos`` run cut by ``timeout`` (SIGTERM) once left ZooKeeper, five
storage nodes and three servers running: Python's default SIGTERM ends the process without
unwinding it. The CLI now turns SIGTERM into ``SystemExit(143)`` (SIGHUP into ``SystemExit(129)``),
so every context manager (the cluster, the client processes, the fault proxies) stops what it
started: every process the run started (found as its descendants before the signal) must be gone
soon after it exits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import support

#: Seconds the run has to start its cluster, then to stop after SIGTERM.
START_TIMEOUT = 120.0
STOP_TIMEOUT = 60.0


def _alive(pid: int, cmdline: str) -> bool:
    """Whether ``pid`` still runs the same program (not a reused process ID, not a zombie)."""
    return support.pid_is_alive(pid) and support.cmdline(pid) == cmdline


@pytest.mark.timeout(300)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_stops_the_cluster_the_run_started(tmp_path: Path, signum: signal.Signals) -> None:
    work = tmp_path / "chaos-sigterm"
    waltz = Path(sys.executable).with_name("waltz")
    command = [str(waltz), "chaos", "--transactions", "1000000", "--seed", "7", "--work-dir", str(work)]
    command += ["--faults", "kill-storage", "--fault-count", "1", "--clients", "1", "--partitions", "1"]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert run.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + START_TIMEOUT
    try:
        for line in run.stdout:
            seen.append(line.rstrip())
            if "submitting" in line or time.monotonic() > deadline:
                break
        assert any("submitting" in line for line in seen), "\n".join(seen[-30:])
        started = support.descendants(run.pid)
        kinds = " ".join(started.values())
        for kind in ("waltz.services.storage", "waltz.services.server", "ZooKeeperServerMain"):
            assert kind in kinds, f"no {kind} process among {started}"
        run.send_signal(signum)
        returncode = run.wait(STOP_TIMEOUT)
        seen += run.stdout.read().splitlines()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(10)
    left: dict[int, str] = {}
    stop_deadline = time.monotonic() + 10
    while time.monotonic() < stop_deadline:
        left = {pid: cmd for pid, cmd in started.items() if _alive(pid, cmd)}
        if not left:
            break
        time.sleep(0.2)
    for pid in left:  # never leave them running, even when the test fails
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert returncode == 128 + signum, "\n".join(seen[-30:])
    assert left == {}, f"processes left running after {signum.name}: {left}"
    assert f"INTERRUPTED; logs and data kept in {work}" in seen, "\n".join(seen[-30:])
