"""benchmarks/peer_flood.py runs end to end at a small size: every flush is answered, the append
of too many lock hashes is refused, and the figures it writes hold every phase."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import waltz

REPO_ROOT = Path(waltz.__file__).resolve().parents[1]


def test_a_small_flood_is_answered_and_its_figures_are_written(tmp_path: Path) -> None:
    figures = tmp_path / "flood.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.peer_flood",
            "--flushes",
            "3000",
            "--per-message",
            "1000",
            "--hashes",
            "20000",
            "--settle",
            "1",
            # A phase whose answers stop coming ends within a minute and the run reports what it
            # got, where the benchmark's 600 s would outlast this test's timeout unreported.
            "--timeout",
            "60",
            # The bounds are the benchmark's business; here only that it runs and reports.
            "--latency-bound-ms",
            "1000000",
            "--memory-bound-mib",
            "100000",
            "--settled-bound-mib",
            "100000",
            "--json",
            str(figures),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "unmounted: 3,000 flushes sent, 0 answers, 3,000 errors" in done.stdout
    assert "mounted: 3,000 flushes sent, 3,000 answers, 0 errors" in done.stdout
    assert "server.maxLockHashesPerMessage" in done.stdout  # the append was refused, naming the bound
    written = json.loads(figures.read_text())
    assert [phase["phase"] for phase in written["phases"]] == [
        "idle",
        "unmounted",
        "mounted",
        "lock hashes",
        "closed",
    ]
    assert written["broken"] == []
    assert all(phase["probes"] > 0 for phase in written["phases"] if phase["phase"] in ("idle", "closed"))
