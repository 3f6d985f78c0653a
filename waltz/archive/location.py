"""Files at a location: a local directory or any URL ``pyarrow.fs`` opens, written safely; JSON
documents of a kind and a form.

Source: docs/design/archive.md "The archive's layout and forms"; docs/design/spark.md
"Snapshots". The archive and snapshots keep their files at such a location (``s3://bucket/path``,
``gs://...``, ``hdfs://...``, or a directory on another disk or NFS). A JSON document is written
to a temporary file and renamed over the old one, so a reader sees the old document or the new
one, never a part; every file's SHA-256 is what a manifest records of it. A manifest says its ``kind``
and its ``form``; a reader refuses another kind and a newer form than it reads.

On a local directory the files are written ``0600`` in ``0700`` directories (docs/design/storage.md,
"File modes": an archive holds every record of the log); at a URL the store's own access rules apply.

Imports only pyarrow (when called), the errors and the file modes, so that every reader of the
archive may use it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from waltz.errors import WaltzError
from waltz.private_files import PRIVATE_FILE_MODE, fsync_directory, fsync_file, private_directory

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs as pafs

__all__ = [
    "LocationError",
    "arrow_owned",
    "check_form",
    "create_private_dir",
    "file_sha256",
    "finish_file",
    "int_field",
    "move_durably",
    "normal_location",
    "open_location",
    "read_file",
    "str_field",
    "write_json_atomically",
]

#: Bytes read at a time when a file is hashed.
READ_BLOCK = 1 << 20


class LocationError(WaltzError):
    """A location that cannot be opened: pyarrow is missing, or the URL names no filesystem it knows."""


def normal_location(location: str) -> str:
    """A location as it is recorded and compared: a directory absolute, without ``~`` or a
    trailing slash; a URL as given, without a trailing slash."""
    if "://" not in location:
        return str(Path(location).expanduser().resolve())
    return location.rstrip("/")


def open_location(location: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and the path of a directory or a URL (``s3://...``), for ``pyarrow.fs``.

    Args:
        location: a directory (``~`` expanded, made absolute) or a URL.

    Returns:
        ``(filesystem, path)``: the path as that filesystem names it.

    Raises:
        LocationError: pyarrow is missing, or the URL names no filesystem pyarrow knows.
    """
    try:
        import pyarrow.fs as pafs
    except ImportError as exc:
        raise LocationError(
            "the archive and snapshots need pyarrow: install waltz-py[archive] (waltz-py[spark] has it too)"
        ) from exc
    if "://" not in location:
        path = str(Path(location).expanduser().resolve())
        return pafs.LocalFileSystem(), path
    try:
        filesystem, path = pafs.FileSystem.from_uri(location)
    except (ValueError, OSError) as exc:
        raise LocationError(f"cannot open {location}: {exc}") from exc
    return filesystem, path


def _is_local(filesystem: pafs.FileSystem) -> bool:
    import pyarrow.fs as pafs

    return isinstance(filesystem, pafs.LocalFileSystem)


def create_private_dir(filesystem: pafs.FileSystem, path: str) -> None:
    """Create a directory and its missing parents: ``0700`` on a local filesystem.

    Raises:
        OSError: the location refused it.
    """
    if _is_local(filesystem):
        private_directory(Path(path))
    else:
        filesystem.create_dir(path, recursive=True)


def finish_file(filesystem: pafs.FileSystem, path: str) -> None:
    """Settle a file just written and closed, on a local filesystem (an NFS mount included):
    ``0600`` whatever the umask and the directory's mode, and flushed to disk before it is renamed
    into place or named by a manifest, since the storage nodes delete segments on the strength of
    the archive's files (docs/design/archive.md "The archiver"). Nothing elsewhere: an object
    store has no modes, and its upload is durable once it has finished.

    Raises:
        OSError: the mode cannot be changed, or the device refused the flush.
    """
    if _is_local(filesystem):
        os.chmod(path, PRIVATE_FILE_MODE)
        fsync_file(path)


def move_durably(filesystem: pafs.FileSystem, source: str, target: str) -> None:
    """Rename ``source`` to ``target`` (replacing it) and, on a local filesystem, flush the
    directory's entries, so that the rename outlives a crash of the host.

    Raises:
        OSError: the location refused the rename, or the device the flush.
    """
    filesystem.move(source, target)
    if _is_local(filesystem):
        fsync_directory(os.path.dirname(target))


def file_sha256(filesystem: pafs.FileSystem, path: str) -> str:
    """The SHA-256 of a file's bytes, hex.

    Raises:
        FileNotFoundError, OSError: the file is missing or unreadable.
    """
    digest = hashlib.sha256()
    with filesystem.open_input_stream(path) as stream:
        while True:
            block = stream.read(READ_BLOCK)
            if not block:
                return digest.hexdigest()
            digest.update(block)


def arrow_owned(data: bytes | bytearray | memoryview) -> pa.Buffer:
    """A copy of ``data`` in memory pyarrow allocated, to hand to pyarrow instead of the Python
    object (docs/design/archive.md "The archive's layout and forms": pyarrow may let go of what it
    is given on one of its threads, and at interpreter exit that aborts the process).

    Raises:
        TypeError: ``data`` is not a C-contiguous buffer.
    """
    import pyarrow as pa

    view = memoryview(data).cast("B")
    owned = pa.allocate_buffer(view.nbytes)
    pa.FixedSizeBufferWriter(owned).write(view)
    return owned


def read_file(filesystem: pafs.FileSystem, path: str) -> bytes:
    """A whole file's bytes.

    Raises:
        FileNotFoundError, OSError: the file is missing or unreadable.
    """
    with filesystem.open_input_stream(path) as stream:
        data: bytes = stream.read()
        return data


def write_json_atomically(filesystem: pafs.FileSystem, path: str, document: Mapping[str, Any]) -> None:
    """Write a JSON document (indented, sorted keys) to ``path.tmp``, then rename it to ``path``;
    on a local filesystem the file is flushed to disk before the rename and the directory after.

    Raises:
        OSError: the location refused the write, the rename or a flush.
    """
    data = json.dumps(document, indent=2, sort_keys=True).encode("utf-8") + b"\n"
    temporary = path + ".tmp"
    with filesystem.open_output_stream(temporary) as stream:
        stream.write(arrow_owned(data))
    finish_file(filesystem, temporary)
    move_durably(filesystem, temporary, path)


def int_field(raw: Mapping[str, Any], key: str, where: str, error: type[WaltzError]) -> int:
    """``raw[key]`` when it is an integer (a JSON number without a fraction; not ``true``, not
    ``1.0``).

    Raises:
        error: the field is missing or not an integer (the file, the field and the value named).
    """
    value = raw.get(key)
    if type(value) is not int:
        raise error(f"{where}: field {key!r} is {value!r}, expected an integer")
    return value


def str_field(raw: Mapping[str, Any], key: str, where: str, error: type[WaltzError]) -> str:
    """``raw[key]`` when it is a string.

    Raises:
        error: the field is missing or not a string (the file, the field and the value named).
    """
    value = raw.get(key)
    if not isinstance(value, str):
        raise error(f"{where}: field {key!r} is {value!r}, expected a string")
    return value


def check_form(
    raw: Any,
    *,
    kind: str,
    newest: int,
    noun: str,
    where: str,
    error: type[WaltzError],
    too_new: type[WaltzError] | None = None,
) -> dict[str, Any]:
    """A parsed JSON manifest, once its ``kind`` is ``kind`` and its ``form`` one this code reads.

    Args:
        raw: the parsed JSON.
        kind: the ``"kind"`` it must have.
        newest: the newest form this code reads.
        noun: what it is, for messages (``snapshot``, ``archive``).
        where: the file, for messages.
        error: the error to raise.
        too_new: the error to raise for a newer form (default ``error``).

    Returns:
        ``raw``, a dict.

    Raises:
        WaltzError: ``error`` or ``too_new``, naming the file.
    """
    if not isinstance(raw, dict) or raw.get("kind") != kind:
        raise error(f'{where} is not a waltz {noun} manifest (no "kind": "{kind}")')
    form = raw.get("form")
    if type(form) is not int or form < 1:
        raise error(f"{where}: its form is {form!r}, not a positive integer")
    if form > newest:
        raise (too_new or error)(
            f"{where}: {noun} form {form} is newer than this waltz-py reads ({newest}); upgrade waltz-py"
        )
    return raw
