"""Hypothesis settings of the fuzz tests (marker ``fuzz``), registered as profiles by tests/conftest.py.

Two profiles:

* ``fuzz`` (the default here): bounded example counts so that the whole suite runs in well under
  a minute on 2 cores; derandomized under CI (``CI`` set), so a CI failure replays exactly.
* ``fuzz-deep``: ten times the examples, random; select it with ``WALTZ_FUZZ_PROFILE=fuzz-deep``.

Each test picks a share of the profile's budget with :func:`fuzz_settings` (file-system and network
tests run fewer examples than pure decoders). The deadline bounds one example of a pure decoder: a
decoder that slows down by orders of magnitude on some input (a hang in the making) fails it; the
file-system and network tests have none (their time is the machine's load), and a true hang is cut
by pytest-timeout.
"""

from __future__ import annotations

import os
from datetime import timedelta

import support
from hypothesis import HealthCheck, settings

__all__ = ["fuzz_settings", "register_profiles"]

#: Examples of a pure decoder test in the ``fuzz`` profile.
BASE_EXAMPLES = 100


def register_profiles() -> None:
    """Register the ``fuzz`` and ``fuzz-deep`` profiles (idempotent)."""
    common = {
        "deadline": timedelta(seconds=2),
        "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
        "print_blob": True,
    }
    settings.register_profile("fuzz", max_examples=BASE_EXAMPLES, derandomize=support.in_ci(), **common)
    settings.register_profile("fuzz-deep", max_examples=BASE_EXAMPLES * 10, **common)


def fuzz_settings(share: float = 1.0, *, io: bool = False) -> settings:
    """Settings for one fuzz test: the selected profile with ``share`` of its examples (at least 5).

    ``io=True`` (examples that touch files or the network, whose time depends on what else the
    machine does) drops the per-example deadline: pytest-timeout still cuts a true hang.
    """
    register_profiles()
    profile = settings.get_profile(os.environ.get("WALTZ_FUZZ_PROFILE", "fuzz"))
    examples = max(5, int(profile.max_examples * share))
    if io:
        return settings(profile, max_examples=examples, deadline=None)
    return settings(profile, max_examples=examples)
