"""Files and directories only their owner may read: the modes of everything the project writes.

Design: docs/design/storage.md, "File modes". A storage node's data (control file, segments,
indexes), the cluster's keys and certificates, archives and snapshots written to a local
directory, and the work directories of local clusters (ZooKeeper's data and the logs included)
are created ``0600`` (files) and ``0700`` (directories), whatever the process's umask; the
processes a local cluster starts run with the umask ``077``, so that what they create is private
too. It also flushes such files and directories to disk (``fsync_file``, ``fsync_directory``) for
the storage node and the archive. This module imports nothing of ours: every layer may use it.
"""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path

__all__ = [
    "PRIVATE_DIRECTORY_MODE",
    "PRIVATE_FILE_MODE",
    "PRIVATE_UMASK",
    "fsync_directory",
    "fsync_file",
    "hold_directory",
    "open_private",
    "open_to_others",
    "private_directory",
    "replaceable_by_others",
    "tighten",
    "write_private",
]

#: The mode of every file the project creates: read and write for the owner only.
PRIVATE_FILE_MODE = 0o600
#: The mode of every directory the project creates: the owner only may list or enter it.
PRIVATE_DIRECTORY_MODE = 0o700
#: The umask of the processes a local cluster starts (what they create is private).
PRIVATE_UMASK = 0o077


def fsync_file(path: Path | str) -> None:
    """Flush a file just written and closed to disk (its data and size), before it is renamed
    into place or relied upon.

    Raises:
        OSError: the file cannot be opened, or the device refused the flush.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_directory(directory: Path | str) -> None:
    """Flush a directory's entries (after creating, renaming, deleting or truncating files in it).

    Raises:
        OSError: the directory cannot be opened, or the device refused the flush.
    """
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def private_directory(path: Path, *, narrow: bool = False) -> Path:
    """Create a directory ``0700`` (and its missing parents ``0700``), whatever the umask.

    An existing directory keeps its mode unless ``narrow``: a directory given by the user (a
    storage node's data directory, a work directory) may be shared, such as ``/tmp``, and is never
    changed; what the project creates inside it is private. ``narrow`` is for directories that are
    the project's own by their place (a partition's directory inside a storage directory).

    Args:
        path: the directory.
        narrow: give an existing directory ``0700`` too.

    Returns:
        ``path``.

    Raises:
        OSError: the directory cannot be created or its mode changed (not its owner), or ``path``
            is a file (:class:`NotADirectoryError`).
    """
    missing = []
    current = path
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=PRIVATE_DIRECTORY_MODE)
        except FileExistsError:
            continue  # made meanwhile by another thread or process: its mode is its maker's
        os.chmod(directory, PRIVATE_DIRECTORY_MODE)  # mkdir's mode is masked by the umask
    if not path.is_dir():
        raise NotADirectoryError(f"{path} is not a directory")
    if narrow:
        tighten(path)
    return path


def replaceable_by_others(path: Path, *, within: tuple[str, ...] = ()) -> str | None:
    """Why another user could have put, or could replace, what a directory holds; None when none can.

    A directory whose contents the project trusts (a local cluster's work directory, with its keys,
    certificates and ZooKeeper credentials; a storage node's data) must be its user's own: owned
    by the process's user and writable by no one else, and each of its parents owned by that user
    or root and writable by others only with the sticky bit (as ``/tmp`` is), so that no one else
    can rename it away and put another in its place; no link on the way as given may belong to
    another user either (they could point it elsewhere). The entries directly inside it, and
    everything under the subdirectories named in ``within``, must be the user's own as well
    (``lstat``: a link counts as what it is, not what it points to). Like OpenSSH's checks of its
    key files. Design: docs/design/storage.md, "File modes".

    Args:
        path: an existing directory.
        within: subdirectories of ``path`` whose whole trees are checked too (small ones: keys).

    Returns:
        The first reason found (naming the path, its owner and mode), or None.
    """
    uid = os.geteuid()

    def problem(entry: Path, info: os.stat_result, *, parent: bool) -> str | None:
        mode = info.st_mode & 0o7777
        owners = (uid, 0) if parent else (uid,)
        if info.st_uid not in owners:
            return f"{entry} belongs to user {info.st_uid}, not to this process's user {uid}"
        if mode & 0o022 and not (parent and mode & 0o1000) and not stat.S_ISLNK(info.st_mode):
            return f"{entry} may be written by other users (mode {mode:o})"
        return None

    given = path.absolute()
    for component in [*reversed(given.parents), given]:  # a link on the way, as it was given
        info = os.lstat(component)
        if stat.S_ISLNK(info.st_mode) and info.st_uid not in (uid, 0):
            return f"{component} is a link that user {info.st_uid} may point elsewhere"
    resolved = path.resolve()
    for ancestor in reversed(resolved.parents):
        found = problem(ancestor, os.stat(ancestor), parent=True)
        if found is not None:
            return found
    entries = [resolved]
    entries += sorted(resolved.iterdir())
    for name in within:
        tree = resolved / name
        if tree.is_dir() and not tree.is_symlink():
            entries += sorted(tree.rglob("*"))
    for entry in entries:
        found = problem(entry, os.lstat(entry), parent=False)
        if found is not None:
            return found
    return None


def open_to_others(path: Path) -> bool:
    """Whether users other than the owner may enter or read a directory (any of ``077``'s bits)."""
    return bool(os.stat(path).st_mode & 0o077)


def tighten(path: Path) -> None:
    """Give an existing file ``0600`` and an existing directory ``0700`` unless they are already so.

    Raises:
        OSError: the mode cannot be changed (not its owner) or the path does not exist.
    """
    mode = PRIVATE_DIRECTORY_MODE if path.is_dir() else PRIVATE_FILE_MODE
    if os.stat(path).st_mode & 0o777 != mode:
        os.chmod(path, mode)


def open_private(path: Path | str, flags: int) -> int:
    """``os.open`` with ``O_CREAT``: a new file is ``0600``, an existing one is narrowed to ``0600``.

    Args:
        path: the file.
        flags: the ``os.O_*`` flags (``O_CREAT`` is added).

    Returns:
        The file descriptor (the caller closes it).

    Raises:
        OSError: as :func:`os.open` (``FileExistsError`` with ``O_EXCL``), or the mode of an
            existing file cannot be changed.
    """
    fd = os.open(path, flags | os.O_CREAT, PRIVATE_FILE_MODE)
    try:
        if os.fstat(fd).st_mode & 0o777 != PRIVATE_FILE_MODE:
            os.fchmod(fd, PRIVATE_FILE_MODE)  # the mode of os.open applies to a new file only
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private(path: Path, data: bytes | str) -> None:
    """Write a whole file ``0600`` (created, or truncated and narrowed to ``0600``).

    Args:
        path: the file; its directory must exist.
        data: bytes, or text written as UTF-8.

    Raises:
        OSError: the file cannot be written.
    """
    payload = data.encode("utf-8") if isinstance(data, str) else data
    with os.fdopen(open_private(path, os.O_WRONLY | os.O_TRUNC), "wb") as out:
        out.write(payload)


def hold_directory(path: Path) -> int | None:
    """Take an exclusive ``flock`` on a directory, for this process alone: one storage node per
    storage directory, one local cluster per work directory (docs/design/storage.md, "File
    modes"). The lock lasts until the returned descriptor is closed or the process ends, however
    it ends; the descriptor is not inherited by the processes it starts.

    Returns:
        The descriptor holding the lock, or None when another holds the directory.

    Raises:
        OSError: the directory cannot be opened.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd
