"""``waltz perf split``: a local cluster split under its producers, figures of both sides and of
the handover, upstream's validate (docs/design/splits.md "Why no update is lost"). Never
timings: the figures depend on the machine; the benchmark prints them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from waltz.cli.main import app
from waltz.perf.split import CounterStore, SplitPerfSettings, _figures

ROOT = Path(__file__).resolve().parents[2]


def test_a_short_run_splits_under_its_producers_and_validates(zookeeper: object) -> None:
    short = ["--before", "1", "--after", "1", "--storages", "1", "--keys", "16", "--json"]
    result = CliRunner().invoke(app, ["perf", "split", *short])
    assert result.exit_code == 0, result.output + repr(result.exception)
    figures = json.loads(result.output.strip().splitlines()[-1])
    assert figures["split_complete"] and figures["validate"] and not figures["failures"]
    assert figures["partitions"] == [2, 4] and figures["commits"] > 0 and figures["secure"]
    for key in ("committed_per_second_before", "committed_per_second_after", "split_seconds"):
        assert figures[key] > 0
    assert figures["longest_pause_seconds_keys_that_move"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--to", "5"], "no split of 2 partitions"),
        (["--partitions", "4", "--to", "4"], "no split of 4 partitions"),
        (["--keys", "3"], "at least one key per partition"),
    ],
)
def test_bad_settings_exit_2_before_anything_starts(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["perf", "split", *args])
    assert result.exit_code == 2 and message in result.output, result.output


def test_validate_fails_on_a_lost_or_doubled_update() -> None:
    settings = SplitPerfSettings(before=1, after=1)
    times = (0.0, 1.0, 2.0, 3.0)
    commits = [(0.5, 1), (0.6, 1), (2.5, 1)]
    good, lost = CounterStore({}), CounterStore({})
    good.values[1] = [1, 2, 3]
    lost.values[1] = [1, 2, 2]  # two bumps read the same value
    assert _figures(settings, commits, [], [good], True, times).validate
    assert not _figures(settings, commits, [], [good, lost], True, times).validate
    assert not _figures(settings, commits, [RuntimeError("x")], [good], True, times).validate


def test_the_benchmark_script_runs_the_same_settings() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.split_pause", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0 and "waltz perf split" in run.stdout, run.stderr
