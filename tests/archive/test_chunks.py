"""The archive's chunks and manifests on a local directory: a round trip of any records, and every
check a reader makes, each naming the file and the range (docs/design/archive.md, "The archive's
layout and forms")."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
import tempfile
import zlib
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz.archive.chunks import (
    chunk_path,
    decode_chunk,
    encode_chunk,
    read_chunk,
    read_chunk_table,
    write_chunk,
)
from waltz.archive.columns import data_crc, table_records
from waltz.archive.errors import ArchiveCheckError, ArchiveFormError, ArchiveUnreadableError
from waltz.archive.layout import (
    ArchiveFiles,
    chunk_name,
    parse_chunk_name,
    partition_directory,
    temporary_name,
)
from waltz.archive.manifests import (
    ArchiveManifest,
    PartitionManifest,
    cluster_key_fingerprint,
    read_archive_manifest,
    read_partition_manifest,
    write_archive_manifest,
    write_partition_manifest,
)
from waltz.archive.reader import ArchivedRangeReader, read_archived
from waltz.archive.verify import verify_archive
from waltz.protocol.records import Record, ReqId

INT32 = st.integers(-(2**31), 2**31 - 1)


@st.composite
def record_runs(draw: st.DrawFn) -> list[Record]:
    """Consecutive records from any start, with any ReqId, header and data."""
    first = draw(st.integers(0, 2**62))
    count = draw(st.integers(1, 40))
    return [
        Record.create(
            first + i,
            ReqId(draw(INT32), draw(INT32), draw(INT32), draw(INT32)),
            draw(INT32),
            draw(st.binary(max_size=300)),
        )
        for i in range(count)
    ]


def records(first: int, count: int, size: int = 20) -> list[Record]:
    return [
        Record.create(t, ReqId(7, 1, 0, t), t % 5, bytes([t % 251]) * size)
        for t in range(first, first + count)
    ]


def archive_of(root: Path, partition_id: int, chunks: Sequence[Sequence[Record]]) -> ArchiveFiles:
    """A partition with the given chunks, written and in its manifest."""
    files = ArchiveFiles.open(str(root))
    manifest = read_partition_manifest(files, partition_id)
    for chunk in chunks:
        manifest = manifest.with_chunk(write_chunk(files, partition_id, chunk, ["node-a:1", "node-b:1"]))
    write_partition_manifest(files, manifest)
    return files


@given(record_runs())
def test_any_records_come_back_as_written(run: list[Record]) -> None:
    with tempfile.TemporaryDirectory() as root:
        files = ArchiveFiles.open(root)
        entry = write_chunk(files, 3, run, ["s:1"])
        assert (entry.first, entry.last, entry.rows) == (
            run[0].transaction_id,
            run[-1].transaction_id,
            len(run),
        )
        assert entry.file == chunk_name(entry.first, entry.last)
        assert read_chunk(files, 3, entry) == run
        # Only the chunk is left in the directory: the temporary file was renamed.
        assert files.files_in(partition_directory(3)) == [entry.file]


@given(st.lists(st.integers(0, 2**32 - 1), max_size=200))
def test_data_crc_is_the_crc_of_the_checksums_as_big_endian_words(checksums: list[int]) -> None:
    expected = zlib.crc32(b"".join(struct.pack(">I", c) for c in checksums))
    assert data_crc(checksums) == expected


def test_a_range_is_read_across_chunks(tmp_path: Path) -> None:
    chunks = [records(0, 10), records(10, 5), records(15, 20)]
    files = archive_of(tmp_path, 0, chunks)
    everything = [r for chunk in chunks for r in chunk]
    assert list(read_archived(str(tmp_path), 0, 0, 34)) == everything
    assert list(read_archived(files, 0, 8, 17)) == everything[8:18]
    with pytest.raises(
        ArchiveCheckError, match=r"partition_id=0 \(transactions 30\.\.35\).*holds transactions 0\.\.34"
    ):
        list(read_archived(files, 0, 30, 35))
    with pytest.raises(ArchiveCheckError, match="holds nothing"):
        list(read_archived(files, 1, 0, 0))


def test_names_and_the_hive_layout() -> None:
    assert chunk_name(0, 99_999) == "00000000000000000000-00000000000000099999.parquet"
    assert parse_chunk_name("00000000000000100000-00000000000000199999.parquet") == (100_000, 199_999)
    assert parse_chunk_name(".00000000000000100000-00000000000000199999.parquet.tmp") is None
    assert partition_directory(12) == "partition_id=12"
    assert cluster_key_fingerprint("6f1c2e4a-9b7d-4c3e-8a21-5d0f3b9e7c11").startswith("sha256:")


def test_the_manifests_are_written_in_their_forms(tmp_path: Path) -> None:
    files = archive_of(tmp_path, 2, [records(100, 3)])
    document = json.loads((tmp_path / "partition_id=2" / "manifest.json").read_text())
    assert document["form"] == 1 and document["kind"] == "waltz-archive-partition"
    assert document["partition_id"] == 2 and document["archived_through"] == 102
    (chunk,) = document["chunks"]
    assert set(chunk) == {
        "first", "last", "file", "rows", "bytes", "sha256", "data_crc", "verified_replicas", "archived_at",
    }  # fmt: skip
    assert chunk["file"] == chunk_name(100, 102) and chunk["rows"] == 3
    assert chunk["bytes"] == (tmp_path / "partition_id=2" / chunk["file"]).stat().st_size
    assert chunk["verified_replicas"] == ["node-a:1", "node-b:1"]
    write_archive_manifest(
        files, ArchiveManifest(4, (cluster_key_fingerprint("k"),), "2026-01-01T00:00:00+00:00")
    )
    top = json.loads((tmp_path / "archive.json").read_text())
    assert top["kind"] == "waltz-archive" and top["form"] == 1 and top["num_partitions"] == 4
    assert read_archive_manifest(files) == ArchiveManifest(
        4, (cluster_key_fingerprint("k"),), top["created_at"]
    )


# --- a damaged chunk: each check names the file and the range ----------------------------------------


@pytest.fixture
def damaged(tmp_path: Path) -> tuple[ArchiveFiles, PartitionManifest, Path]:
    files = archive_of(tmp_path, 0, [records(0, 50), records(50, 50)])
    manifest = read_partition_manifest(files, 0)
    return files, manifest, tmp_path / "partition_id=0" / manifest.chunks[1].file


def _problem(files: ArchiveFiles, manifest: PartitionManifest) -> str:
    """The problem both chunk readers find: record by record (servers, tools) and on the columns
    (Spark); the same message."""
    with pytest.raises(ArchiveCheckError) as raised:
        read_chunk(files, 0, manifest.chunks[1])
    message = str(raised.value)
    assert f"partition_id=0/{chunk_name(50, 99)} (transactions 50..99)" in message
    assert raised.value.first == 50 and raised.value.last == 99
    with pytest.raises(ArchiveCheckError) as on_columns:
        read_chunk_table(files, 0, manifest.chunks[1])
    assert str(on_columns.value) == message
    return message


def test_chunks_and_manifests_are_on_disk_before_they_are_relied_upon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each file is flushed to disk before it is renamed into place, and its directory after: the
    storage nodes delete what the archive holds once the manifest names it."""
    events: list[tuple[str, str]] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    archive_of(tmp_path, 1, [records(0, 4)])
    directory = tmp_path / "partition_id=1"
    assert [path for _, path in events] == [
        str(directory / temporary_name(chunk_name(0, 3))),  # the chunk, before its rename
        str(directory),  # the rename
        str(directory / "manifest.json.tmp"),  # the manifest naming it, before its rename
        str(directory),
    ]
    chunk = chunk_path(1, chunk_name(0, 3))
    assert (tmp_path / chunk).exists() and not list(Path(directory).glob("*.tmp"))


def test_the_columnar_read_gives_the_chunks_rows(
    damaged: tuple[ArchiveFiles, PartitionManifest, Path],
) -> None:
    files, manifest, _ = damaged
    table = read_chunk_table(files, 0, manifest.chunks[1])
    assert table_records(table) == records(50, 50)


def test_a_chunk_with_a_transaction_out_of_place(
    damaged: tuple[ArchiveFiles, PartitionManifest, Path],
) -> None:
    files, manifest, path = damaged
    bad = records(50, 50)
    bad[3] = bad[3]._replace(transaction_id=77)
    data, _ = encode_chunk(bad)
    path.write_bytes(data)
    entry = dataclasses.replace(
        manifest.chunks[1], sha256=hashlib.sha256(data).hexdigest(), size_bytes=len(data)
    )
    assert "row 3 is transaction 77, not 53" in _problem(files, manifest.with_chunk_replaced(entry))


def test_a_range_reader_reads_each_chunk_once_while_paging_and_sees_new_chunks(tmp_path: Path) -> None:
    files = archive_of(tmp_path, 0, [records(0, 50), records(50, 50)])
    reader = ArchivedRangeReader(files)
    paged = [r for first in range(0, 100, 10) for r in reader.read(0, first, first + 9)]
    assert paged == records(0, 100) and reader.chunk_reads == 2
    with pytest.raises(ArchiveCheckError, match=r"holds transactions 0\.\.99"):
        reader.read(0, 95, 104)
    write_partition_manifest(
        files, read_partition_manifest(files, 0).with_chunk(write_chunk(files, 0, records(100, 10), ["t"]))
    )
    assert reader.read(0, 95, 104) == records(95, 10)  # the manifest is read again past its end
    assert reader.read(0, 5, 4) == []


def test_a_missing_chunk(damaged: tuple[ArchiveFiles, PartitionManifest, Path]) -> None:
    files, manifest, path = damaged
    path.unlink()
    assert "missing" in _problem(files, manifest)


def test_a_truncated_chunk(damaged: tuple[ArchiveFiles, PartitionManifest, Path]) -> None:
    files, manifest, path = damaged
    path.write_bytes(path.read_bytes()[:-100])
    assert "truncated" in _problem(files, manifest)


def test_a_corrupted_byte(damaged: tuple[ArchiveFiles, PartitionManifest, Path]) -> None:
    files, manifest, path = damaged
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    assert "SHA-256" in _problem(files, manifest)


def test_a_manifest_with_a_wrong_sha256(damaged: tuple[ArchiveFiles, PartitionManifest, Path]) -> None:
    files, manifest, _ = damaged
    wrong = manifest.with_chunk_replaced(dataclasses.replace(manifest.chunks[1], sha256="0" * 64))
    assert "the manifest says 0000" in _problem(files, wrong)


def test_a_chunk_whose_records_fail_their_checksums(
    damaged: tuple[ArchiveFiles, PartitionManifest, Path],
) -> None:
    """A chunk rewritten whole with a record whose data no longer matches its checksum (the file's
    SHA-256 in the manifest made to match, as a faulty writer would)."""
    files, manifest, path = damaged
    bad = records(50, 50)
    bad[7] = bad[7]._replace(data=b"changed")
    data, _ = encode_chunk(bad)
    path.write_bytes(data)
    entry = dataclasses.replace(
        manifest.chunks[1], sha256=hashlib.sha256(data).hexdigest(), size_bytes=len(data)
    )
    assert "transaction 57: its data does not match its checksum" in _problem(
        files, manifest.with_chunk_replaced(entry)
    )


def test_a_wrong_data_crc(damaged: tuple[ArchiveFiles, PartitionManifest, Path]) -> None:
    files, manifest, _ = damaged
    wrong = manifest.with_chunk_replaced(
        dataclasses.replace(manifest.chunks[1], data_crc=manifest.chunks[1].data_crc ^ 1)
    )
    assert "data_crc" in _problem(files, wrong)


# --- manifests that are not to be trusted ---------------------------------------------------------


def _write_manifest(root: Path, document: object) -> ArchiveFiles:
    directory = root / "partition_id=0"
    directory.mkdir(exist_ok=True)
    (directory / "manifest.json").write_text(json.dumps(document))
    return ArchiveFiles.open(str(root))


def test_a_non_contiguous_manifest_names_the_chunk_and_its_range(tmp_path: Path) -> None:
    files = archive_of(tmp_path, 0, [records(0, 10), records(10, 10)])
    document = read_partition_manifest(files, 0).to_json()
    gap = dict(document["chunks"][1], first=12, file=chunk_name(12, 19), rows=8)
    _write_manifest(tmp_path, {**document, "chunks": [document["chunks"][0], gap]})
    with pytest.raises(
        ArchiveCheckError, match=r"manifest\.json \(transactions 12\.\.19\): the chunk .* leaves a gap"
    ):
        read_partition_manifest(files, 0)
    overlap = dict(document["chunks"][1], first=5, file=chunk_name(5, 19), rows=15)
    _write_manifest(tmp_path, {**document, "chunks": [document["chunks"][0], overlap]})
    with pytest.raises(ArchiveCheckError, match=r"\(transactions 5\.\.19\): the chunk .* overlaps"):
        read_partition_manifest(files, 0)


def test_a_manifest_the_location_refuses_to_read_is_an_archive_error_naming_it(tmp_path: Path) -> None:
    """A directory where a manifest should be, or a file where the archive's directory should be:
    an error the commands report (exit 2, or a problem of verify), not an OSError's traceback."""
    files = archive_of(tmp_path, 0, [records(0, 3)])
    manifest = tmp_path / "partition_id=0" / "manifest.json"
    manifest.unlink()
    manifest.mkdir()
    with pytest.raises(ArchiveUnreadableError, match=r"partition_id=0/manifest\.json cannot be read: "):
        read_partition_manifest(files, 0)
    (tmp_path / "a-file").write_text("not a directory")
    beneath = ArchiveFiles.open(str(tmp_path / "a-file" / "archive"))
    with pytest.raises(ArchiveUnreadableError, match=r"archive\.json cannot be read: "):
        read_archive_manifest(beneath)


def test_a_newer_form_is_refused_with_upgrade(tmp_path: Path) -> None:
    files = _write_manifest(tmp_path, {"form": 2, "kind": "waltz-archive-partition", "partition_id": 0})
    with pytest.raises(
        ArchiveFormError, match=r"partition_id=0/manifest\.json: archive form 2 .*upgrade waltz-py"
    ):
        read_partition_manifest(files, 0)
    (tmp_path / "archive.json").write_text(json.dumps({"form": 9, "kind": "waltz-archive"}))
    with pytest.raises(ArchiveFormError, match=r"archive\.json: archive form 9 .*upgrade"):
        read_archive_manifest(files)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("not json", "is not JSON"),
        ("[" * 60_000, "is not JSON"),  # nested deeper than the JSON decoder recurses
        ('{"form": 1, "archived_through": ' + "9" * 5_000 + "}", "is not JSON"),  # too many digits
        ({"form": 1, "kind": "waltz-snapshot"}, "not a waltz archive manifest"),
        ({"form": 1, "kind": "waltz-archive-partition", "partition_id": 5}, "of partition 5"),
        ({"form": 1, "kind": "waltz-archive-partition", "partition_id": 0}, "'chunks'"),
        (
            {
                "form": 1,
                "kind": "waltz-archive-partition",
                "partition_id": 0,
                "archived_through": 3,
                "chunks": [],
            },
            "archived_through is 3",
        ),
    ],
)
def test_a_malformed_manifest_is_named(tmp_path: Path, document: object, message: str) -> None:
    directory = tmp_path / "partition_id=0"
    directory.mkdir()
    (directory / "manifest.json").write_text(document if isinstance(document, str) else json.dumps(document))
    with pytest.raises((ArchiveFormError, ArchiveCheckError), match=message):
        read_partition_manifest(ArchiveFiles.open(str(tmp_path)), 0)


def test_a_chunk_entry_must_name_its_range(tmp_path: Path) -> None:
    files = archive_of(tmp_path, 0, [records(0, 10)])
    document = read_partition_manifest(files, 0).to_json()
    _write_manifest(tmp_path, {**document, "chunks": [dict(document["chunks"][0], file="other.parquet")]})
    with pytest.raises(ArchiveFormError, match=r"names the file 'other\.parquet'"):
        read_partition_manifest(files, 0)
    _write_manifest(tmp_path, {**document, "chunks": [dict(document["chunks"][0], rows=11)]})
    with pytest.raises(ArchiveFormError, match="11 rows, not 10"):
        read_partition_manifest(files, 0)


def test_a_manifest_refuses_a_chunk_that_does_not_follow(tmp_path: Path) -> None:
    files = archive_of(tmp_path, 0, [records(0, 10)])
    manifest = read_partition_manifest(files, 0)
    entry = write_chunk(files, 0, records(11, 3), ["s:1"])
    with pytest.raises(ArchiveCheckError, match="must start at 10"):
        manifest.with_chunk(entry)
    assert chunk_path(0, entry.file) == f"partition_id=0/{chunk_name(11, 13)}"


def test_pyarrow_holds_no_reference_to_a_chunk_s_bytes_once_it_is_read() -> None:
    """pyarrow's scanner lets go of its input on one of its own threads, at times after the read
    returned; when that input is a Python object and the interpreter is exiting by then, the
    process aborts after its work is done ("terminate called without an active exception", exit
    status 134: ``waltz archive verify``, ``waltz disk dump --archive``, a server's archived
    reads). A chunk is read from a copy pyarrow owns: a bytearray it held would refuse to grow."""
    data, table = encode_chunk(records(0, 300))
    for _ in range(50):
        chunk = bytearray(data)
        assert decode_chunk(chunk, "chunk").equals(table)
        chunk.append(0)  # BufferError while pyarrow still holds a view of it


def test_a_chunk_is_read_from_any_contiguous_buffer_of_its_bytes() -> None:
    """The copy pyarrow reads is of the buffer's bytes, not of its items: a view of 4-byte items
    reads the same chunk as the bytes do."""
    data, table = next(
        (d, t) for d, t in (encode_chunk(records(0, n)) for n in range(1, 200)) if len(d) % 4 == 0
    )
    wide = memoryview(data).cast("I")
    assert len(wide) * 4 == wide.nbytes == len(data)
    assert decode_chunk(wide, "chunk").equals(table)
    assert decode_chunk(memoryview(data), "chunk").equals(table)


def test_verify_says_how_far_it_is_within_a_partition(tmp_path: Path) -> None:
    """A partition of many chunks takes long to verify (and so a restore): verify says how far it is
    every ``progress_every`` seconds, within the partition, not only once it is done
    (docs/design/archive.md, "The archiver"); 0 gives a line per chunk."""
    files = archive_of(tmp_path / "archive", 0, [records(0, 10), records(10, 10), records(20, 5)])
    lines: list[str] = []
    report = verify_archive(files, None, 1, progress=lines.append, progress_every=0.0)
    assert report.partitions[0].records_checked == 25 and not report.partitions[0].problems
    assert lines == [
        "partition 0: 1 of 3 chunks checked (through transaction 9), 10 records so far",
        "partition 0: 2 of 3 chunks checked (through transaction 19), 20 records so far",
        "partition 0: 3 of 3 chunks checked (through transaction 24), 25 records so far",
        "partition 0: 3 chunks, 25 records: OK",
    ]
    quiet: list[str] = []
    verify_archive(files, None, 1, progress=quiet.append)  # the default: every few seconds
    assert quiet == ["partition 0: 3 chunks, 25 records: OK"]
