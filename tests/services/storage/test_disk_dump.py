"""``waltz disk dump``: a partition's records across its segments, and from the archive below its
local start (docs/design/archive.md, "Reads below the local start").

A real storage directory whose first segments retention deleted, and a real archive (chunks
written and checked as the archiver writes them) holding the range they held.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.services.storage.test_retention import ARCHIVED, Disk, filled, records
from waltz.archive.chunks import write_chunk
from waltz.archive.layout import ArchiveFiles, partition_directory
from waltz.archive.manifests import (
    ArchiveManifest,
    PartitionManifest,
    cluster_key_fingerprint,
    write_archive_manifest,
    write_partition_manifest,
)
from waltz.cli.main import app
from waltz.services.storage import inspect

runner = CliRunner()


@dataclass
class Retained:
    """A storage directory holding ``local_start..59`` of partition 0, and an archive of 0..29."""

    storage_dir: Path
    archive: Path
    local_start: int


@pytest.fixture
def retained(tmp_path: Path) -> Iterator[Retained]:
    (tmp_path / "storage").mkdir()
    disk = Disk(tmp_path / "storage")
    try:
        partition = filled(disk, 60)
        location = tmp_path / "archive"
        files = ArchiveFiles.open(str(location))
        # As the archiver starts an archive: archive.json first (docs/design/archive.md, "The
        # archive's layout and forms").
        write_archive_manifest(
            files,
            ArchiveManifest(2, (cluster_key_fingerprint(str(uuid.uuid4())),), "2026-01-01T00:00:00+00:00"),
        )
        manifest = PartitionManifest(0)
        for first in (0, 15):
            manifest = manifest.with_chunk(write_chunk(files, 0, records(first, 15), ["test"]))
        write_partition_manifest(files, manifest)
        partition.set_archived_through(29)
        partition.apply_retention(ARCHIVED, 1e12)
        assert 0 < partition.local_start <= 30
        yield Retained(tmp_path / "storage", location, partition.local_start)
    finally:
        disk.close()


def test_a_dump_reads_below_the_local_start_from_the_archive(retained: Retained) -> None:
    dumped = list(
        inspect.dump_records(retained.storage_dir, 0, 5, 45, ArchiveFiles.open(str(retained.archive)))
    )
    assert [d.record for d in dumped] == records(5, 41)
    start = retained.local_start
    assert all(d.archived for d in dumped[: start - 5]) and not any(d.archived for d in dumped[start - 5 :])
    assert dumped[0].source.endswith("partition_id=0/00000000000000000000-00000000000000000014.parquet")
    result = runner.invoke(
        app, ["disk", "dump", str(retained.storage_dir), "-p", "0", "--archive", str(retained.archive)]
    )
    assert result.exit_code == 0, result.output
    assert f"partition 0: local start {start}, last on disk 59" in result.output
    assert "holds 0..29" in result.output and "(60 records listed)" in result.output
    assert "archive 00000000000000000015-00000000000000000029.parquet" in result.output
    # The archive alone, as JSON.
    result = runner.invoke(
        app, ["disk", "dump", "--archive", str(retained.archive), "--to-txn", "3", "--json"]
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert [r["transaction_id"] for r in document["records"]] == [0, 1, 2, 3]
    assert all(r["archived"] for r in document["records"])


def test_a_dump_below_the_local_start_without_the_archive_names_the_range(retained: Retained) -> None:
    result = runner.invoke(app, ["disk", "dump", str(retained.storage_dir), "--from-txn", "0"])
    assert result.exit_code == 2
    assert f"transactions 0..{retained.local_start - 1} are not in" in result.output
    assert "--archive" in result.output


def test_ranges_that_cannot_be_listed_are_errors_not_empty_listings(retained: Retained) -> None:
    """Below the local start with the default start, an empty range, a partition the directory
    does not hold: each an error naming it (exit 2), never "(0 records listed)" and exit 0."""
    storage = str(retained.storage_dir)
    start = retained.local_start
    for arguments, words in (
        (["--to-txn", "5"], f"transactions 0..5 are not in {storage} (its local start is {start}"),
        (["--from-txn", "40", "--to-txn", "5"], "--from-txn 40 is after --to-txn 5: an empty range"),
        (["-p", "7"], f"partition 7: {storage} holds no such partition (it holds 0"),
    ):
        result = runner.invoke(app, ["disk", "dump", storage, *arguments])
        assert result.exit_code == 2, result.output
        assert words in result.output and "records listed" not in result.output, result.output
    # With the archive, a range below where the listing would start is read there.
    result = runner.invoke(
        app, ["disk", "dump", storage, "--archive", str(retained.archive), "--to-txn", "2"]
    )
    assert result.exit_code == 0, result.output
    assert "(3 records listed)" in result.output


def test_a_damaged_chunk_fails_the_dump_naming_the_file_and_range(retained: Retained) -> None:
    chunk = retained.archive / partition_directory(0) / "00000000000000000000-00000000000000000014.parquet"
    chunk.write_bytes(chunk.read_bytes()[:-10])
    result = runner.invoke(
        app,
        ["disk", "dump", str(retained.storage_dir), "--archive", str(retained.archive), "--from-txn", "0"],
    )
    assert result.exit_code == 2
    assert "00000000000000000000-00000000000000000014.parquet (transactions 0..14)" in result.output
    assert "truncated or replaced" in result.output


def test_a_location_that_holds_no_archive_or_not_the_partition_is_named(
    retained: Retained, tmp_path: Path
) -> None:
    """A mistyped --archive, or a partition the archive does not have, is an error (exit 2), not an
    archive that holds nothing (an empty listing, exit 0)."""
    missing = tmp_path / "archve"
    for command, words in (
        (["disk", "dump", "--archive", str(missing), "-p", "0"], f"{missing} holds no archive"),
        (
            ["disk", "dump", str(retained.storage_dir), "--archive", str(missing), "-p", "0"],
            f"{missing} holds no archive",
        ),
        (["disk", "dump", "--archive", str(retained.archive), "-p", "7"], "has partitions 0..1"),
    ):
        result = runner.invoke(app, command)
        assert result.exit_code == 2, result.output
        assert words in result.output and "records listed" not in result.output, result.output
