"""SIGTERM to a ``waltz`` tool that started a local cluster stops the cluster too.

A 1,000,000-transaction ``waltz chaos`` run cut by ``timeout`` (SIGTERM) once left ZooKeeper, five
storage nodes and three servers running: Python's default SIGTERM ends the process without
unwinding it. The CLI now turns SIGTERM into ``SystemExit(143)``, so every context manager (the
cluster, the client processes, the fault proxies) stops what it started.
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

#: Seconds the run has to start its cluster, then to stop after SIGTERM.
START_TIMEOUT = 120.0
STOP_TIMEOUT = 60.0


def _processes_using(path: Path) -> list[str]:
    """Command lines of running processes that name ``path`` (the run's work directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if str(path) in cmdline:
            found.append(f"{entry.name}: {cmdline[:200]}")
    return found


@pytest.mark.timeout(300)
def test_sigterm_stops_the_cluster_the_run_started(tmp_path: Path) -> None:
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
        assert _processes_using(work), "the run started no process in its work directory"
        run.send_signal(signal.SIGTERM)
        returncode = run.wait(STOP_TIMEOUT)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(10)
    left: list[str] = []
    stop_deadline = time.monotonic() + 10
    while time.monotonic() < stop_deadline:
        left = _processes_using(work)
        if not left:
            break
        time.sleep(0.2)
    for line in left:  # never leave them running, even when the test fails
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(line.split(":")[0]), signal.SIGKILL)
    assert returncode == 128 + signal.SIGTERM, "\n".join(seen[-30:])
    assert left == [], f"processes left running after SIGTERM: {left}"
