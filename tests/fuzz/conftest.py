"""The fuzz suite: hypothesis against every decoder of bytes from disk, the network or files.

The hypothesis profiles ``fuzz`` (CI: bounded, derandomized under ``CI``) and ``fuzz-deep``
(``WALTZ_FUZZ_PROFILE=fuzz-deep``) are registered here (see ``fuzz_settings.py``); each test applies
them with ``@fuzz_settings(share)``, so they never change the profile of other suites.
"""

from __future__ import annotations

from fuzz_settings import register_profiles

register_profiles()
