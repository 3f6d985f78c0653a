"""The ``waltz`` data source's options (docs/spark.md, "The data source"): an option that is not
of its form is refused naming it and its value, before the log is planned or read, where it gave
a bare Python error or, for a ``range_size`` below 1, an empty read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from waltz.errors import ConfigurationError
from waltz.spark.source import WaltzLogReader


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("partitions", "x", r"option partitions='x': 'x' is not a partition ID"),
        ("partitions", "0,-1", r"option partitions='0,-1': '-1' is not a partition ID"),
        ("range_size", "-5", r"option range_size='-5': give an integer of at least 1"),
        ("range_size", "0", r"option range_size='0': give an integer of at least 1"),
        ("range_size", "ten", r"option range_size='ten' is not an integer"),
        ("batch_records", "0", r"option batch_records='0': give an integer of at least 1"),
        ("batch_records", "1.5", r"option batch_records='1.5' is not an integer"),
        ("timeout", "abc", r"option timeout='abc' is not a number of seconds"),
        ("timeout", "0", r"option timeout='0': give a finite number of seconds above 0"),
        ("timeout", "-1", r"option timeout='-1': give a finite number of seconds above 0"),
        ("timeout", "nan", r"option timeout='nan': give a finite number of seconds above 0"),
        ("timeout", "inf", r"option timeout='inf': give a finite number of seconds above 0"),
    ],
)
@pytest.mark.parametrize("where", ["offline", "live"])
def test_an_option_not_of_its_form_is_refused_naming_it(
    tmp_path: Path, where: str, name: str, value: str, said: str
) -> None:
    """Refused before the log is planned: the directory holds no replica and nothing listens at
    the ZooKeeper address, which planning would report instead."""
    source = (
        {"storage_dirs": str(tmp_path), "replicas": "1"}
        if where == "offline"
        else {"zookeeper": "127.0.0.1:1", "cluster_root": "/waltz/nowhere"}
    )
    with pytest.raises(ConfigurationError, match=said):
        WaltzLogReader({**source, name: value}).partitions()


def test_a_range_size_below_one_fails_the_read_rather_than_reading_nothing(
    spark: Any, tmp_path: Path
) -> None:
    log = (
        spark.read.format("waltz")
        .option("storage_dirs", str(tmp_path))
        .option("replicas", "1")
        .option("range_size", "-5")
        .load()
    )
    with pytest.raises(Exception, match=r"option range_size='-5': give an integer of at least 1"):
        log.count()
