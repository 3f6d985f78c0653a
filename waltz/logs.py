"""Logging set-up for command-line entry points."""

from __future__ import annotations

import logging
import os

__all__ = ["configure_logging"]


def configure_logging(level: str | None = None) -> None:
    """Log to stderr with timestamps; the level comes from ``level`` or ``WALTZ_LOG_LEVEL`` (INFO)."""
    logging.basicConfig(
        level=(level or os.environ.get("WALTZ_LOG_LEVEL", "INFO")).upper(),
        format="%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s",
    )
