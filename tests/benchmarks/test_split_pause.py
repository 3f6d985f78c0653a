"""``python -m benchmarks.split_pause`` does the work its figures describe: the split completes
under its producers, and upstream's validate passes (docs/design/splits.md "Why no update is
lost"). Its timings are the benchmark's to print, not this test's to check."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_short_run_splits_under_its_producers_and_validates(tmp_path: Path) -> None:
    out = tmp_path / "split.json"
    short = ["--before", "1", "--after", "1", "--storages", "1", "--keys", "16", "--json", str(out)]
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.split_pause", *short],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["split_complete"] and figures["validate"] and not figures["failures"]
    assert figures["partitions"] == [2, 4] and figures["commits"] > 0
    for key in ("committed_per_second_before", "longest_pause_seconds_keys_that_move", "split_seconds"):
        assert figures[key] >= 0
