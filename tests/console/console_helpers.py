"""Helpers of the console tests: a ``waltz console`` process, the chromium binary."""

from __future__ import annotations

import json
import re
import shutil
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from waltz.local.cluster import LocalCluster
from waltz.local.processes import ManagedProcess, free_port, wait_until

#: Seconds between two looks of the consoles under test.
REFRESH = 0.5


def assigned_storages(cluster: LocalCluster, partition_id: int) -> list[str]:
    """The storage nodes ZooKeeper assigns ``partition_id`` to (read with a session of its own)."""
    from kazoo.client import KazooClient

    from waltz.metadata.zk import ClusterZk

    client = KazooClient(hosts=cluster.zookeeper_connect_string)
    client.start(timeout=10)
    try:
        return ClusterZk(client, cluster.root).assignments().value.storages_of(partition_id)
    finally:
        client.stop()
        client.close()


def chromium_path() -> str | None:
    """The chromium binary to drive, or None."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


@dataclass
class RunningConsole:
    """A ``waltz console`` process and its URL."""

    process: ManagedProcess
    url: str
    tls: ssl.SSLContext | None = None

    def get_json(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path.lstrip("/"), timeout=5, context=self.tls) as response:
            return json.loads(response.read())

    def wait_ready(self) -> None:
        """Wait until the console answers with a cluster map."""
        wait_until(
            lambda: self.get_json("/api/map.json")["map"] is not None,
            timeout=30,
            what=f"the console at {self.url} to show the cluster map",
            interval=0.1,
        )

    def log(self) -> str:
        """Everything the process wrote (standard output and error)."""
        log_path = self.process.log_path
        assert log_path is not None
        return log_path.read_text(errors="replace")

    def start_url(self) -> str:
        """The URL of the console's start line (with ``?token=...`` when actions need it)."""
        found = wait_until(
            lambda: re.search(r"^waltz console of \S+ at (\S+) \(.*Ctrl-C stops it$", self.log(), re.M),
            timeout=30,
            what=f"the start line of the console at {self.url}",
            interval=0.1,
        )
        return found.group(1)

    def token(self) -> str:
        """The start token of the console's URL (operator actions without browser certificates)."""
        found = re.search(r"[?&]token=([^&#]+)", self.start_url())
        assert found is not None, self.start_url()
        return found.group(1)

    def close(self) -> None:
        self.process.terminate(timeout=10)


def launch_console(
    tmp_path: Path,
    cluster: LocalCluster,
    *extra: str,
    name: str = "console",
    tls: ssl.SSLContext | None = None,
    env: Mapping[str, str] | None = None,
) -> RunningConsole:
    """Start ``waltz console`` on a free port against ``cluster`` (over HTTPS with ``tls``, the
    client context that trusts it; ``env``: its whole environment, None inherits this one's);
    :meth:`RunningConsole.wait_ready` waits for its first look."""
    port = free_port()
    args = [
        sys.executable,
        "-c",
        "from waltz.cli.main import main; main()",
        "console",
        "--zookeeper",
        cluster.zookeeper_connect_string,
        "--root",
        cluster.root,
        "--port",
        str(port),
        "--refresh",
        str(REFRESH),
        "--timeout",
        "2",
        *(arg for name_, url in cluster.metrics_urls().items() for arg in ("--metrics", f"{name_}={url}")),
        *extra,
    ]
    process = ManagedProcess(args, name=name, log_path=tmp_path / f"{name}.log", env=env)
    process.start()
    return RunningConsole(process, f"{'https' if tls else 'http'}://127.0.0.1:{port}/", tls)


def request(
    url: str,
    body: str | None = None,
    context: ssl.SSLContext | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, str]:
    """GET (no body) or POST ``body`` as a form; the status and the text of the answer."""
    data = None if body is None else body.encode()
    method = "GET" if body is None else "POST"
    sent = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(sent, timeout=30, context=context) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode()


def act(
    console: RunningConsole,
    form: str,
    context: ssl.SSLContext | None = None,
    headers: dict[str, str] | None = None,
) -> list[int]:
    """Ask for an action and, when a confirmation comes back, run it: the statuses of both steps."""
    return act_and_read(console, form, context, headers)[0]


def act_and_read(
    console: RunningConsole,
    form: str,
    context: ssl.SSLContext | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[list[int], str]:
    """:func:`act`, with the text of the last answer (the confirmation's refusal, or the outcome)."""
    status, text = request(console.url + "actions/confirm", form, context, headers)
    statuses = [status]
    confirmation = re.search(r'name="token" value="([^"]+)"', text)
    if confirmation is not None:
        run_form = f"token={confirmation.group(1)}"
        start_token = parse_qs(form).get("console_token")
        if start_token:
            run_form += f"&console_token={start_token[0]}"
        status, text = request(console.url + "actions/run", run_form, context, headers)
        statuses.append(status)
    return statuses, text
