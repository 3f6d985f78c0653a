"""Helpers for storage node tests."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

#: The number of partitions of the clusters that storage tests create.
NUM_PARTITIONS = 4


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from a synchronous test."""
    return asyncio.run(coroutine)
