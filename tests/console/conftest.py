"""Fixtures of the console tests: one local cluster and one browser per module.

The browser is Debian's ``chromium`` driven by Playwright for Python (``executable_path``; no
browser download). Without a chromium binary the browser tests are skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import support

from tests.console.console_helpers import RunningConsole, chromium_path
from waltz.local.cluster import LocalCluster


@pytest.fixture(scope="module")
def console_cluster(tmp_path_factory: pytest.TempPathFactory, zookeeper: object) -> Iterator[LocalCluster]:
    """3 storage nodes, 2 servers, 2 partitions, every node serving /metrics."""
    with support.session_cluster(
        tmp_path_factory,
        zookeeper,
        name="console",
        partitions=2,
        servers=2,
        metrics=True,
        security=support.PLAINTEXT,  # the console's own TLS and roles are set up by its tests
    ) as cluster:
        yield cluster


@pytest.fixture
def cluster(
    request: pytest.FixtureRequest, console_cluster: LocalCluster, consoles: dict[str, RunningConsole]
) -> LocalCluster:
    """The module's cluster, healed (every process running, every partition writable), with each
    of the module's ``consoles`` logs in the report of a failed test."""
    for name, console in consoles.items():
        support.add_failure_logs(request.node, f"{name} console log", console.process.log_tail)
    return support.healed_cluster(request, console_cluster)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """A headless chromium (Playwright), shared by the module's tests."""
    executable = chromium_path()
    if executable is None:
        pytest.skip("no chromium binary (Debian: apt-get install -y chromium chromium-driver)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        support.unavailable("Playwright for Python is not installed (the dev extra has it)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True)
        try:
            yield browser
        finally:
            browser.close()
