"""docs/deploy.md, run as written on three (then four) hosts made of network namespaces.

The guide marks what it runs with an HTML comment before a fenced block,
``<!-- deploy: host=waltz-1,waltz-2 retry=60 -->``: a block with a ``title="PATH"`` is a file,
written on each named host; any other block is shell, run on each named host, command by command,
in the order of the page (``retry=N``: each command is repeated until it exits 0, for at most N
seconds). Each host is a :class:`~waltz.local.netns.NetworkLab` namespace with the guide's own
address (``waltz-1`` = 10.77.0.11 ... ``waltz-4`` = 10.77.0.14, the root namespace 10.77.0.1).

What stands in for a real host:

- Paths: ``/etc/waltz``, ``/var/lib/waltz``, ``/etc/zookeeper``, ``/var/lib/zookeeper``,
  ``/var/backups/waltz`` and ``/etc/systemd/system`` are mapped to ``<tmp>/<host>/...`` in files,
  commands and unit lines.
- ``systemctl enable --now|start|stop|restart UNIT`` reads ``<tmp>/<host>/etc/systemd/system/UNIT.service``
  and runs its ``ExecStart`` (with ``Environment=`` and ``EnvironmentFile=``) inside the host as a
  :class:`~waltz.local.processes.ManagedProcess`; stop is SIGTERM then SIGKILL after
  ``TimeoutStopSec``. ``User=``, ``Limit*=`` and ``Restart=`` are not applied: everything runs as
  root and a unit that exits fails the test; ``UMask=`` is applied (systemd's ``0022`` without
  it). ``systemctl daemon-reload`` does nothing. Each host starts with an empty
  ``/etc/systemd/system`` and ``/etc/zookeeper/conf``, as a host with Debian's packages has them.
- ``/opt/waltz/bin/waltz`` and ``waltz`` are this interpreter's ``python -m waltz``.
- ``scp [-p] SRC ADDRESS:DST`` copies between the hosts' directories (the destination's directory
  must exist, as for scp), with the source host's mapped paths in a text file made the target's.
- Installation commands (``apt-get``, ``python3 -m venv``, ``/opt/waltz/bin/pip``, ``useradd``,
  ``chown``) are skipped: the machine has Debian's ZooKeeper, Java and the project installed.

After the guide (or, in the default suite, after its first start and checks) a client in the root
namespace, built from the guide's ``/etc/waltz/client.yaml`` (its TLS files and ZooKeeper
credential), commits transactions and reads them back; every file and directory the guide made on
every host must be readable by its owner only (:func:`open_to_others`), and the transcript must not
hold the cluster key. The full run (``-m slow``, about two minutes)
also commits before the backup and between the backup and the restore, and checks after the
restore, the new node and the upgrade that every acknowledged transaction is in the log at its ID,
without gaps, and that every assigned replica holds the whole log. A third test breaks a key of
the guide's storage file and checks that the first start fails, naming it. Every
command and its output go to ``<tmp>/transcript.txt`` (and to ``$WALTZ_DEPLOY_GUIDE_TRANSCRIPT``
when set).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.client.client_helpers import Append, MemoryStore
from waltz import WaltzClient, WaltzClientConfig
from waltz.admin.config import ClusterAdminConfig
from waltz.config import load_settings
from waltz.errors import ConfigurationError
from waltz.local.netns import NetworkLab, network_lab_unavailable, nft_unavailable, unused_subnet
from waltz.local.processes import ManagedProcess, wait_until
from waltz.local.zookeeper import find_java, find_zookeeper_classpath
from waltz.metadata.zk import ClusterZk
from waltz.metadata.zk_session import connect_zookeeper

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"
ADDRESSES = {
    "waltz-1": "10.77.0.11",
    "waltz-2": "10.77.0.12",
    "waltz-3": "10.77.0.13",
    "waltz-4": "10.77.0.14",
}
#: The network of the guide's addresses (NetworkLab's default subnet).
GUIDE_SUBNET = "10.77.0.0/24"
MAPPED = (
    "/etc/systemd/system",
    "/etc/waltz",
    "/etc/zookeeper",
    "/var/lib/waltz",
    "/var/lib/zookeeper",
    "/var/backups/waltz",
)
SKIPPED = ("apt-get ", "python3 -m venv ", "/opt/waltz/bin/pip ", "useradd ", "chown ")
PARTITIONS = 3
#: Directories a host has before the guide (the system's and the packages'), which may be open.
SYSTEM_DIRECTORIES = frozenset(
    {"/etc", "/var", "/var/lib", "/var/backups", "/etc/systemd", "/etc/systemd/system", "/etc/zookeeper"}
    | {"/etc/zookeeper/conf"}
)
#: The last section of the first start: the default suite runs the guide up to here.
FIRST_START_END = "Checking the cluster"

_BLOCK = re.compile(
    r"<!--\s*deploy:(?P<attrs>[^>]*)-->\s*\n```(?P<lang>\w+)(?P<info>[^\n]*)\n(?P<body>.*?)\n```", re.S
)
_HEADING = re.compile(r"^## (.+)$", re.M)
_SUBHEADING = re.compile(r"^### (.+)$", re.M)
#: The subsection of "Backups and restore" that loses the cluster and restores it from the archive.
CLUSTER_RESTORE = "Restore a lost cluster from the archive"
_MAPPED_PATH = re.compile(r"(?<![\w./-])(" + "|".join(re.escape(p) for p in MAPPED) + r")(?=[/\s'\":]|$)")


@dataclass(frozen=True)
class Step:
    """One marked block of the guide."""

    section: str
    subsection: str | None  # the ``###`` heading within the section, if any
    hosts: tuple[str, ...]
    path: str | None  # a file's path, or None for shell
    body: str
    retry: float | None


def parse_guide(text: str) -> list[Step]:
    """The guide's marked blocks, in order, each with the ``##`` section it is in."""
    headings = [(m.start(), m.group(1).strip()) for m in _HEADING.finditer(text)]
    subheadings = [(m.start(), m.group(1).strip()) for m in _SUBHEADING.finditer(text)]
    steps = []
    for match in _BLOCK.finditer(text):
        attrs = dict(item.split("=", 1) for item in match.group("attrs").split())
        section_start, section = [(start, title) for start, title in headings if start < match.start()][-1]
        within = [title for start, title in subheadings if section_start < start < match.start()]
        title = re.search(r'title="([^"]+)"', match.group("info"))
        hosts = tuple(attrs["host"].split(","))
        assert set(hosts) <= set(ADDRESSES), f"unknown host in {match.group(0)[:80]}"
        retry = float(attrs["retry"]) if "retry" in attrs else None
        steps.append(
            Step(
                section,
                within[-1] if within else None,
                hosts,
                title.group(1) if title else None,
                match.group("body"),
                retry,
            )
        )
    return steps


def commands_of(body: str) -> list[str]:
    """The shell commands of a block: one per line, backslash continuations joined."""
    commands: list[str] = []
    pending = ""
    for line in body.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        command = (pending + line).strip()
        pending = ""
        if command and not command.startswith("#"):
            commands.append(command)
    return commands


class Deployment:
    """The hosts of the guide: their directories, units and commands, and a transcript."""

    def __init__(self, lab: NetworkLab, root: Path) -> None:
        self.lab = lab
        self.root = root
        self.units: dict[tuple[str, str], ManagedProcess] = {}
        self.transcript = root / "transcript.txt"
        shims = root / "bin"
        shims.mkdir(parents=True)
        shim = shims / "waltz"
        shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m waltz "$@"\n')
        shim.chmod(0o755)
        self.env = {**os.environ, "PATH": f"{shims}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        for host in ADDRESSES:
            (root / host / "etc" / "systemd" / "system").mkdir(parents=True)  # every host has it
            (root / host / "etc" / "zookeeper" / "conf").mkdir(parents=True)  # Debian's package's

    def path(self, host: str, path: str) -> Path:
        """Where a host's absolute ``path`` is on this machine."""
        return Path(self.map(host, path))

    def map(self, host: str, text: str) -> str:
        """``text`` with the host's mapped directories in place of the real ones."""
        return _MAPPED_PATH.sub(lambda m: f"{self.root / host}{m.group(1)}", text)

    def log(self, line: str) -> None:
        with self.transcript.open("a") as out:
            out.write(line + "\n")

    # --- steps ------------------------------------------------------------------------------------

    def run(self, step: Step) -> None:
        for host in step.hosts:
            if step.path is not None:
                target = self.path(host, step.path)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(self.map(host, step.body) + "\n")
                self.log(f"[{host}] wrote {step.path}")
                continue
            for command in commands_of(step.body):
                self.command(host, command, step.retry)

    def command(self, host: str, command: str, retry: float | None) -> None:
        if command.startswith(SKIPPED):
            self.log(f"[{host}] $ {command}\n    (skipped: installs software or accounts)")
            return
        words = shlex.split(command)
        if words[0] == "systemctl":
            self.log(f"[{host}] $ {command}")
            self.systemctl(host, words[1:])
            return
        if words[0] == "scp":
            self.log(f"[{host}] $ {command}")
            self.scp(host, [w for w in words[1:] if w != "-p"])
            return
        argv = [*self.lab.command_prefix(host), "bash", "-eo", "pipefail", "-c", self.map(host, command)]
        last: list[subprocess.CompletedProcess[str]] = []

        def attempt() -> bool:
            failed = self.exited_units()
            if failed:
                raise UnitExitedError(failed)
            result = subprocess.run(
                argv, capture_output=True, text=True, env=self.env, timeout=180, check=False
            )
            last[:] = [result]
            return result.returncode == 0

        started = time.monotonic()
        try:
            if retry is None:
                ok = attempt()
            else:
                ok = wait_until(
                    attempt, timeout=retry, what=command, interval=1.0, abort_on=(UnitExitedError,)
                )
        except TimeoutError:
            ok = False
        except UnitExitedError as error:
            self.log(f"[{host}] $ {command}\n    (not run: {str(error).splitlines()[0]})")
            raise AssertionError(f"on {host}, before {command!r}: {error}") from None
        result = last[0]
        output = (result.stdout + result.stderr).rstrip()
        self.log(
            f"[{host}] $ {command}\n"
            + "".join(f"    {line}\n" for line in output.splitlines())
            + f"    (exit {result.returncode}, {time.monotonic() - started:.1f}s)"
        )
        if not ok:
            raise AssertionError(
                f"on {host}: {command!r} exited {result.returncode}"
                + (f" (retried for {retry}s)" if retry else "")
                + f":\n{output}\n{self.exited_units()}"
            )

    def systemctl(self, host: str, args: list[str]) -> None:
        verbs = [a for a in args if not a.startswith("--")]
        if verbs == ["daemon-reload"]:
            return
        verb, unit = verbs[0], verbs[1]
        if verb in ("stop", "restart"):
            self.stop(host, unit)
        if verb in ("start", "restart") or (verb == "enable" and "--now" in args):
            self.start(host, unit)
        elif verb not in ("stop", "enable"):
            raise AssertionError(f"the harness does not know 'systemctl {' '.join(args)}'")

    def start(self, host: str, unit: str) -> None:
        key = (host, unit)
        if key in self.units and self.units[key].is_running():
            return
        service = unit_service(self.path(host, f"/etc/systemd/system/{unit}.service").read_text())
        env = dict(self.env)
        for line in service.get("Environment", []):
            for item in shlex.split(line):
                name, _, value = item.partition("=")
                env[name] = value
        for name in service.get("EnvironmentFile", []):
            for line in self.path(host, name).read_text().splitlines():
                if "=" in line and not line.lstrip().startswith("#"):
                    key_, _, value = line.partition("=")
                    env[key_.strip()] = value.strip()
        (umask,) = service.get("UMask", ["0022"])
        (exec_start,) = service["ExecStart"]
        argv = [self.map(host, word) for word in shlex.split(exec_start)]
        if argv[0] == "/opt/waltz/bin/waltz":
            argv = [sys.executable, "-m", "waltz", *argv[1:]]
        process = ManagedProcess(
            [*self.lab.command_prefix(host), *argv],
            name=f"{host}/{unit}",
            log_path=self.root / "logs" / f"{host}-{unit}.log",
            env=env,
            cwd=self.root / host,
            umask=int(umask, 8),
        )
        self.units[key] = process
        process.start()

    def stop(self, host: str, unit: str) -> None:
        process = self.units.pop((host, unit), None)
        if process is not None:
            process.terminate(timeout=30)

    def scp(self, host: str, args: list[str]) -> None:
        source, target = args
        address, _, target_path = target.partition(":")
        (target_host,) = [name for name, a in ADDRESSES.items() if a == address]
        destination = self.path(target_host, target_path)
        assert destination.parent.is_dir(), f"scp: {target_path}'s directory does not exist on {target_host}"
        shutil.copy2(self.path(host, source), destination)
        # A file may hold the source host's mapped paths: the target host's own, as on real hosts.
        with contextlib.suppress(UnicodeDecodeError):
            text = destination.read_text()
            destination.write_text(text.replace(f"{self.root / host}/", f"{self.root / target_host}/"))

    def exited_units(self) -> str:
        """The started units that exited without a ``systemctl stop``, with the end of their logs."""
        lines = []
        for (host, unit), process in self.units.items():
            if not process.is_running():
                tail = process.log_tail(20)
                lines.append(f"unit {unit} on {host} exited with {process.returncode}:\n{tail}")
        return "\n".join(lines)

    def output(self, host: str, command: str) -> str:
        """The standard output of a shell command run in ``host`` (with mapped paths); it must succeed."""
        argv = [*self.lab.command_prefix(host), "bash", "-eo", "pipefail", "-c", self.map(host, command)]
        result = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=180, check=False)
        assert result.returncode == 0, f"{command!r} exited {result.returncode}: {result.stderr}"
        return result.stdout

    def close(self) -> None:
        for process in self.units.values():
            process.kill()
        self.units.clear()


def open_to_others(hosts: Deployment) -> list[str]:
    """The files and directories the guide made on its hosts that its group or other users may
    read, write or enter, as ``host:/path mode``.

    Every path under a host's directory counts but :data:`SYSTEM_DIRECTORIES` (their files count).
    """
    found = []
    for host in ADDRESSES:
        base = hosts.root / host
        for path in sorted(base.rglob("*")):
            name = "/" + path.relative_to(base).as_posix()
            mode = path.lstat().st_mode
            if name not in SYSTEM_DIRECTORIES and mode & 0o077:
                found.append(f"{host}:{name} {oct(mode & 0o777)}")
    return found


def assert_private(hosts: Deployment) -> None:
    """Every file and directory the guide made is its owner's only."""
    open_paths = open_to_others(hosts)
    assert not open_paths, "the guide made these open to other users:\n" + "\n".join(open_paths)


def cluster_key(hosts: Deployment) -> uuid.UUID:
    """The cluster key, read from ZooKeeper with the guide's operator settings."""
    config = load_settings(ClusterAdminConfig, hosts.path("waltz-1", "/etc/waltz/cluster.yaml"))
    assert config.zookeeper_connect_string is not None and config.cluster_root is not None
    zk = connect_zookeeper(config.zookeeper_connect_string, security=config.zookeeper_security())
    try:
        return ClusterZk(zk, config.cluster_root).params().cluster_key
    finally:
        zk.stop()
        zk.close()


def assert_key_not_printed(hosts: Deployment, key: uuid.UUID) -> None:
    """The transcript of the guide's commands holds the cluster key in none of its spellings."""
    text = hosts.transcript.read_text().lower()
    printed = any(spelling in text for spelling in (str(key), key.hex))
    assert not printed, f"the cluster key appears in {hosts.transcript}"  # not shown here either


class UnitExitedError(Exception):
    """A unit's process exited though nothing stopped it (systemd would restart it in a loop)."""


def unit_service(text: str) -> dict[str, list[str]]:
    """The ``[Service]`` lines of a systemd unit: key -> values, in order."""
    service: dict[str, list[str]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            service.setdefault(key.strip(), []).append(value.strip())
    return service


def zookeeper_unavailable() -> str | None:
    """Why the guide's ZooKeeper unit cannot run here (no Java, no Debian ZooKeeper jars), or None."""
    try:
        find_java()
        find_zookeeper_classpath()
    except ConfigurationError as error:
        return str(error)
    return None


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    reason = network_lab_unavailable() or nft_unavailable() or zookeeper_unavailable()
    if reason is None and shutil.which("openssl") is None:
        reason = "the openssl command is missing (Debian: apt-get install -y openssl)"
    if reason is not None:
        pytest.skip(reason)
    NetworkLab.cleanup_stale()
    try:
        unused_subnet(within=GUIDE_SUBNET)
    except ConfigurationError:
        pytest.fail(
            "10.77.0.0/24, the network of the guide's addresses, is in use on this machine (another "
            "lab: a `waltz up --network namespaces` or a test run beside this one?); stop it first"
        )
    with NetworkLab(list(ADDRESSES), subnet=GUIDE_SUBNET, addresses=ADDRESSES) as lab:
        hosts = Deployment(lab, tmp_path)
        try:
            yield hosts
        finally:
            hosts.close()
            copy = os.environ.get("WALTZ_DEPLOY_GUIDE_TRANSCRIPT")
            if copy and hosts.transcript.exists():
                shutil.copyfile(hosts.transcript, copy)


def client_config(hosts: Deployment) -> WaltzClientConfig:
    """The guide's client settings, as an application on waltz-1 would load them."""
    return load_settings(WaltzClientConfig, hosts.path("waltz-1", "/etc/waltz/client.yaml"))


def commit(
    hosts: Deployment, count: int, label: str, after: dict[int, int] | None = None
) -> dict[bytes, tuple[int, int]]:
    """Commit ``count`` transactions over the partitions, as a client that has applied the log up
    to ``after`` (default: nothing); returns data -> (partition, ID)."""
    acknowledged = {}
    store = MemoryStore(dict(after) if after is not None else dict.fromkeys(range(PARTITIONS), -1))
    with WaltzClient(store, client_config(hosts)) as client:
        for i in range(count):
            context = Append(i % PARTITIONS, f"{label} {i}".encode())
            transaction_id = client.submit(context).result(60).transaction_id
            assert transaction_id is not None
            acknowledged[context.data] = (context.partition, transaction_id)
    return acknowledged


def read_back(hosts: Deployment, after: dict[int, int] | None = None) -> dict[int, dict[int, bytes]]:
    """Every partition's log after ``after`` (default: from its start) as a new client applies it:
    partition -> ID -> data, the IDs consecutive from ``after + 1`` to the high-water mark."""
    start = after if after is not None else dict.fromkeys(range(PARTITIONS), -1)
    store = MemoryStore(dict(start))
    with WaltzClient(store, client_config(hosts)) as client:
        marks = {p: client.get_high_water_mark(p) for p in range(PARTITIONS)}
        wait_until(
            lambda: all(store.marks[p] >= marks[p] for p in range(PARTITIONS)),
            timeout=60,
            what=f"the client to apply every partition up to {marks}",
        )
    assert not store.errors, store.errors
    log = {}
    for partition in range(PARTITIONS):
        applied = store.applied[partition]
        assert [a.transaction_id for a in applied][: marks[partition] - start[partition]] == list(
            range(start[partition] + 1, marks[partition] + 1)
        )
        log[partition] = {a.transaction_id: a.data for a in applied}
    return log


def assert_in_log(log: dict[int, dict[int, bytes]], acknowledged: dict[bytes, tuple[int, int]]) -> None:
    for data, (partition, transaction_id) in acknowledged.items():
        entries = log[partition]
        assert transaction_id in entries, (
            f"{data!r} (ID {transaction_id}) is not in partition {partition}'s log"
        )
        assert entries[transaction_id] == data, (
            f"partition {partition} ID {transaction_id}: {entries[transaction_id]!r}"
        )
        assert list(entries.values()).count(data) == 1, f"{data!r} is in the log more than once"


def test_the_guide_parses_into_files_and_commands_on_its_hosts() -> None:
    steps = parse_guide(GUIDE.read_text())
    files = {step.path for step in steps if step.path}
    assert {
        "/etc/zookeeper/conf/zoo.cfg",
        "/etc/waltz/storage.yaml",
        "/etc/waltz/server.yaml",
        "/etc/waltz/client.yaml",
        "/etc/systemd/system/waltz-server.service",
    } <= files
    sections = [step.section for step in steps]
    assert FIRST_START_END in sections and "Upgrades" in sections
    for step in steps:
        if step.path is None:
            assert commands_of(step.body), step


def run_guide(hosts: Deployment, steps: list[Step]) -> None:
    section = None
    for step in steps:
        if step.section != section:
            section = step.section
            hosts.log(f"## {section}")
        hosts.run(step)


def test_first_start_of_the_guide_gives_a_cluster_that_commits(deployment: Deployment) -> None:
    steps = parse_guide(GUIDE.read_text())
    last = max(i for i, step in enumerate(steps) if step.section == FIRST_START_END)
    run_guide(deployment, steps[: last + 1])
    acknowledged = commit(deployment, 30, "first start")
    assert_in_log(read_back(deployment), acknowledged)
    deployment.command("waltz-1", "waltz cluster verify --config /etc/waltz/cluster.yaml", None)
    assert_private(deployment)
    assert_key_not_printed(deployment, cluster_key(deployment))


def test_a_wrong_key_in_the_guides_storage_file_fails_the_first_start(deployment: Deployment) -> None:
    text = GUIDE.read_text()
    good = "  admin:\n    port: 55281\n"
    assert good in text, "the guide's storage.yaml changed: update this test"
    steps = parse_guide(text.replace(good, "  admin:\n    prot: 55281\n", 1))
    last = max(i for i, step in enumerate(steps) if step.section == FIRST_START_END)
    with pytest.raises(
        AssertionError, match=r"(?s)unit waltz-storage on waltz-\d exited.*storage\.admin\.prot"
    ):
        run_guide(deployment, steps[: last + 1])


def replicas_lagging(hosts: Deployment, marks: dict[int, int]) -> list[str]:
    """The assigned replicas whose last transaction is not the partition's high-water mark."""
    listing = json.loads(
        hosts.output("waltz-1", "waltz storage list --json --config /etc/waltz/cluster.yaml")
    )
    lagging = []
    for node in listing["storage_nodes"]:
        held = {p["partition_id"]: p["max_transaction_id"] for p in node["partitions"]}
        lagging += [
            f"{node['storage']} partition {pid}: {held.get(pid)} of {marks[pid]}"
            for pid in node["assigned"]
            if held.get(pid) != marks[pid]
        ]
    return lagging


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_whole_guide_keeps_every_transaction(deployment: Deployment) -> None:
    """Every transaction committed before the node's backup, between the backup and the restore,
    is in the log at its ID; the cluster lost and restored from the archive continues the log
    after the archive's end (what it holds below is the archive's, not read here); the
    transactions after the restore, the new node and the upgrade are in the log at their IDs."""
    steps = parse_guide(GUIDE.read_text())
    backups = min(i for i, step in enumerate(steps) if step.section == "Backups and restore")
    restore = min(i for i, step in enumerate(steps) if "mv /var/lib/waltz/storage " in step.body)
    lost = [i for i, step in enumerate(steps) if step.subsection == CLUSTER_RESTORE]
    assert lost and restore < lost[0], "the cluster's restore follows the node's"
    run_guide(deployment, steps[:backups])
    acknowledged = commit(deployment, 60, "before the backup")
    run_guide(deployment, steps[backups:restore])
    acknowledged |= commit(deployment, 60, "after the backup")  # the restored node lacks these
    run_guide(deployment, steps[restore : lost[0]])
    log = read_back(deployment)
    assert_in_log(log, acknowledged)
    archived = {partition: max(entries) for partition, entries in log.items()}
    lost_key = cluster_key(deployment)
    run_guide(deployment, steps[lost[0] : lost[-1] + 1])
    status = json.loads(
        deployment.output("waltz-1", "waltz archive status --json --config /etc/waltz/cluster.yaml")
    )
    for line in status["partitions"]:
        through = archived[line["partition_id"]]
        assert line["archive"]["archived_through"] == through, line
        assert {r["local_start"] for r in line["replicas"]} == {through + 1}, line
    acknowledged = commit(deployment, 30, "after the cluster's restore", after=archived)
    assert sorted(i for p, i in acknowledged.values() if p == 0)[0] == archived[0] + 1
    run_guide(deployment, steps[lost[-1] + 1 :])
    acknowledged |= commit(deployment, 30, "after the upgrade", after=archived)
    log = read_back(deployment, after=archived)
    assert_in_log(log, acknowledged)
    marks = {partition: max(entries, default=archived[partition]) for partition, entries in log.items()}
    wait_until(
        lambda: not replicas_lagging(deployment, marks),
        timeout=60,
        what=f"every assigned replica (the new one too) to hold the log up to {marks}",
    )
    deployment.command("waltz-1", "waltz cluster verify --config /etc/waltz/cluster.yaml", None)
    assert_private(deployment)
    for key in (lost_key, cluster_key(deployment)):
        assert_key_not_printed(deployment, key)
