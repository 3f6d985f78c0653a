"""Checks of the values an application hands the client: integers bound for the wire and timeouts.

Source: docs/design/client.md "Transaction contexts and callbacks". A wrong value raises here, in
the application's own call (or fails only its own context), never later on the client's event loop,
where encoding one append's message would fail the connection that every partition on that server
shares.
"""

from __future__ import annotations

import math
import operator

__all__ = ["as_bytes", "check_client_mark", "check_integer", "check_limit", "check_seconds"]

_INT64_MAX = (1 << 63) - 1


def check_integer(value: object, what: str) -> int:
    """``value`` as an ``int``: an ``int`` or another integer type (one with ``__index__``, such as
    numpy's), never a ``bool``, a ``float`` or a string.

    Args:
        value: what the application gave.
        what: how the error names it, e.g. ``"transaction header"``.

    Raises:
        TypeError: ``value`` is not an integer.
    """
    if type(value) is int:
        return value
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{what} must be an int, not {type(value).__name__} {value!r}")
    return operator.index(value)  # type: ignore[arg-type]


def check_seconds(value: float | None, what: str) -> float | None:
    """A timeout in seconds: None (no limit), zero (do not wait) or a positive finite number.

    Args:
        value: the timeout given.
        what: how the error names it, e.g. ``"flush timeout"``.

    Raises:
        TypeError: ``value`` is not a number.
        ValueError: ``value`` is negative, NaN or infinite (pass None for no limit).
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be seconds (a number) or None, not {type(value).__name__} {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} of {value!r} seconds: give zero or more seconds, or None for no limit")
    return value


def check_limit(value: float, what: str) -> float:
    """A timeout that must be given, for a call with no unbounded form (``ready``,
    ``wait_mounted``, ``get_high_water_mark``): zero (do not wait) or a positive finite number of
    seconds. Unlike :func:`check_seconds`, its errors do not offer None.

    Args:
        value: the timeout given.
        what: how the error names it, e.g. ``"ready timeout"``.

    Raises:
        TypeError: ``value`` is None or not a number.
        ValueError: ``value`` is negative, NaN or infinite.
    """
    if value is None:
        raise TypeError(f"{what} must be seconds (a number); this call has no unbounded form")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be seconds (a number), not {type(value).__name__} {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(
            f"{what} of {value!r} seconds: give zero or more finite seconds (this call has no unbounded form)"
        )
    return float(value)


def as_bytes(data: object, what: str) -> bytes:
    """A copy of bytes-like ``data`` as ``bytes``.

    Raises:
        TypeError: ``data`` is not bytes-like (``bytes(5)`` would be five zero bytes).
    """
    try:
        view = memoryview(data)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"{what} must be bytes-like (bytes, bytearray, memoryview), not {type(data).__name__}"
        ) from None
    with view:
        return view.tobytes()


def check_client_mark(mark: object, what: str) -> int:
    """A client high-water mark: an int from -1 (nothing applied) to the largest signed 64-bit
    integer (docs/protocol.md "Append").

    Raises:
        TypeError: ``mark`` is not an int (None included).
        ValueError: ``mark`` is out of that range.
    """
    value = check_integer(mark, what)
    if value < -1:
        raise ValueError(f"{what} {value} is below -1 (-1: no transaction applied)")
    if value > _INT64_MAX:
        raise ValueError(f"{what} {value} does not fit in a signed 64-bit integer")
    return value
