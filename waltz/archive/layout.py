"""Where the archive's files are: names, directories, and the files at one location.

Source: docs/design/archive.md "The archive's layout and forms"::

    <archive>/archive.json
    <archive>/partition_id=<N>/manifest.json
    <archive>/partition_id=<N>/<first, 20 digits>-<last, 20 digits>.parquet

A chunk is written under a hidden temporary name (``.<name>.tmp``, which neither Spark nor
pyarrow's datasets read) and renamed when it has been read back and checked.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from waltz.archive.errors import ArchiveFormError, ArchiveUnreadableError, ArchiveUnwritableError
from waltz.archive.location import (
    arrow_owned,
    create_private_dir,
    finish_file,
    move_durably,
    open_location,
    read_file,
    write_json_atomically,
)

if TYPE_CHECKING:
    import pyarrow.fs as pafs

__all__ = [
    "ARCHIVE_MANIFEST",
    "PARTITION_MANIFEST",
    "ArchiveFiles",
    "chunk_name",
    "parse_chunk_name",
    "partition_directory",
    "temporary_name",
]

#: The archive's manifest, at its root.
ARCHIVE_MANIFEST = "archive.json"
#: A partition's manifest, in its directory.
PARTITION_MANIFEST = "manifest.json"
#: Digits of each transaction ID in a chunk's name.
ID_DIGITS = 20

_CHUNK_NAME = re.compile(rf"^(\d{{{ID_DIGITS}}})-(\d{{{ID_DIGITS}}})\.parquet$")


def partition_directory(partition_id: int) -> str:
    """A partition's directory in the archive, Hive-style: ``partition_id=<N>``."""
    return f"partition_id={partition_id}"


def chunk_name(first: int, last: int) -> str:
    """The file name of the chunk holding ``first..last``: both IDs in 20 digits."""
    return f"{first:0{ID_DIGITS}d}-{last:0{ID_DIGITS}d}.parquet"


def parse_chunk_name(name: str) -> tuple[int, int] | None:
    """``(first, last)`` of a chunk's file name, or None when the name is not a chunk's."""
    match = _CHUNK_NAME.match(name)
    return None if match is None else (int(match.group(1)), int(match.group(2)))


def temporary_name(name: str) -> str:
    """The hidden name a chunk is written under before it is checked and renamed."""
    return f".{name}.tmp"


@dataclass(frozen=True, slots=True)
class ArchiveFiles:
    """The files of an archive at one location.

    Attributes:
        location: the location as the user gave it (a directory or a URL); messages name files by it.
        filesystem: the ``pyarrow.fs`` filesystem of the location.
        root: the archive's path on that filesystem.
    """

    location: str
    filesystem: pafs.FileSystem
    root: str

    @classmethod
    def open(cls, location: str) -> ArchiveFiles:
        """The files at ``location``.

        Raises:
            LocationError: pyarrow is missing, or the URL names no filesystem it knows.
        """
        filesystem, root = open_location(location)
        return cls(location, filesystem, root)

    def path(self, relative: str) -> str:
        """The path of a file of the archive on its filesystem."""
        return posixpath.join(self.root, relative)

    def name(self, relative: str) -> str:
        """A file of the archive as messages name it: the location, then the file's path in it."""
        return self.location.rstrip("/") + "/" + relative

    def exists(self, relative: str) -> bool:
        """True when the file or directory exists."""
        import pyarrow.fs as pafs

        return bool(self.filesystem.get_file_info(self.path(relative)).type != pafs.FileType.NotFound)

    def read(self, relative: str) -> bytes:
        """A file's bytes.

        Raises:
            FileNotFoundError, OSError: the file is missing or unreadable.
        """
        return read_file(self.filesystem, self.path(relative))

    def write(self, relative: str, data: bytes) -> None:
        """Write a file (its directory is created when missing; both private on a local directory,
        and the file flushed to disk there).

        Raises:
            OSError: the location refused the write, or the device the flush.
        """
        create_private_dir(self.filesystem, posixpath.dirname(self.path(relative)))
        with self.filesystem.open_output_stream(self.path(relative)) as stream:
            # A copy pyarrow owns: an object store's stream may upload it on a thread of its own,
            # after write returned (docs/design/archive.md "The archive's layout and forms").
            stream.write(arrow_owned(data))
        finish_file(self.filesystem, self.path(relative))

    def move(self, source: str, target: str) -> None:
        """Rename a file of the archive (replacing ``target``); on a local directory the rename
        is flushed to disk before this returns.

        Raises:
            OSError: the location refused the rename, or the device the flush.
        """
        move_durably(self.filesystem, self.path(source), self.path(target))

    def delete(self, relative: str) -> None:
        """Delete a file of the archive."""
        self.filesystem.delete_file(self.path(relative))

    def files_in(self, directory: str) -> list[str]:
        """The names of the files directly in a directory of the archive (none when it is missing)."""
        return sorted(self.file_sizes(directory))

    def file_sizes(self, directory: str) -> dict[str, int]:
        """The files directly in a directory of the archive, by name, with their sizes in bytes
        (empty when it is missing)."""
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self.path(directory), allow_not_found=True)
        return {
            posixpath.basename(info.path): int(info.size)
            for info in self.filesystem.get_file_info(selector)
            if info.type == pafs.FileType.File
        }

    def read_json(self, relative: str) -> Any | None:
        """A JSON document of the archive, or None when the file is missing.

        Raises:
            ArchiveFormError: the file is not JSON (named).
            ArchiveUnreadableError: the location refused the read (named, with its reason).
        """
        try:
            data = self.read(relative)
        except FileNotFoundError:
            return None
        except OSError as exc:  # a directory in its place, permissions, a disk's or a store's error
            raise ArchiveUnreadableError(f"{self.name(relative)} cannot be read: {exc}") from exc
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as exc:  # not JSON, nested too deep, too many digits
            raise ArchiveFormError(f"{self.name(relative)} is not JSON: {exc}") from exc

    def write_json(self, relative: str, document: dict[str, Any]) -> None:
        """Write a JSON document to a temporary file, then rename it over ``relative`` (its
        directory created when missing).

        Raises:
            ArchiveUnwritableError: the location refused the write (named, with its reason).
        """
        try:
            create_private_dir(self.filesystem, posixpath.dirname(self.path(relative)))
            write_json_atomically(self.filesystem, self.path(relative), document)
        except OSError as exc:  # a file where a directory should be, read-only, full, a store's error
            raise ArchiveUnwritableError(f"{self.name(relative)} cannot be written: {exc}") from exc
