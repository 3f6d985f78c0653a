"""Small file-system helpers for crash-safe file handling."""

from __future__ import annotations

import errno

from waltz.private_files import fsync_directory

__all__ = ["NO_SPACE_ERRNOS", "fsync_directory", "is_no_space"]

#: errno values that mean the device (or a quota, or a file size limit) has no room left.
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def is_no_space(exc: OSError) -> bool:
    """Return True when an OSError means that no space is left for the write."""
    return exc.errno in NO_SPACE_ERRNOS
