"""Logging set-up for command-line entry points."""

from __future__ import annotations

import logging
import os
import sys

__all__ = ["IGNORED_VARIABLES_LOGGER", "LOG_LEVELS", "configure_logging"]

#: The level names ``--log-level`` and ``WALTZ_LOG_LEVEL`` take (any case).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

#: The logger of the warnings that an environment variable nearly naming a setting is ignored
#: (docs/configuration.md): shown whatever the level, since the commands that log errors only
#: would hide them, and an ignored TLS file can mean plaintext.
IGNORED_VARIABLES_LOGGER = "waltz.config.ignored_variables"


def configure_logging(level: str | None = None) -> None:
    """Log to stderr with timestamps; the level comes from ``level`` or ``WALTZ_LOG_LEVEL`` (INFO).

    Args:
        level: a name of :data:`LOG_LEVELS` in any case (``WARN`` and ``FATAL`` too, as
            :mod:`logging` knows them), or None for ``WALTZ_LOG_LEVEL``.

    Raises:
        SystemExit: status 2, after one line on stderr naming the level and the names taken, when
            the level is none of them (the command has not started anything yet).
    """
    name = level or os.environ.get("WALTZ_LOG_LEVEL") or "INFO"
    if name.upper() not in logging.getLevelNamesMapping():
        sys.stderr.write(
            f"error: unknown log level {name!r} (from --log-level or WALTZ_LOG_LEVEL); "
            f"use one of {', '.join(LOG_LEVELS)}\n"
        )
        raise SystemExit(2)
    logging.basicConfig(
        level=name.upper(),
        format="%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s",
    )
    ignored = logging.getLogger(IGNORED_VARIABLES_LOGGER)
    if ignored.getEffectiveLevel() > logging.WARNING:
        ignored.setLevel(logging.WARNING)
