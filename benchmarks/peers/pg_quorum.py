"""A PostgreSQL primary with two synchronous standbys in quorum, on loopback, for one run.

The durability of a Waltz partition at RF 3 on PostgreSQL: a commit returns once its WAL is
flushed on the primary and on one of the two standbys (``synchronous_standby_names = 'ANY 1 (s1,
s2)'``, ``synchronous_commit = on``), so 2 of 3 copies are durable, as a transaction is committed
once a quorum of its partition's replicas has flushed it (docs/design/server.md, "Quorum writes
and batching"). The SmallBank peer runs on it with ``bench_smallbank_pg --quorum``.

:class:`PgQuorum` makes the three servers in a temporary directory and removes them: ``initdb``
the primary (trust authentication, user postgres, free loopback ports, WAL for replication), start
it, ``pg_basebackup`` each standby from it (its own replication slot, ``application_name`` s1 or
s2), start them, and wait until the primary's ``pg_stat_replication`` shows both streaming with
``sync_state = 'quorum'``. On exit, error or Ctrl-C it stops the three (``pg_ctl stop -m fast``,
then ``-m immediate``, then SIGKILL of a postmaster that is still there) and removes the
directory. A postmaster runs in a session of its own (``pg_ctl`` starts it so): a signal to the
benchmark's process group does not reach it, the context manager does.

The server binaries (``initdb``, ``pg_ctl``, ``pg_basebackup``) are taken from ``WALTZ_PG_BIN``
when set, else from where ``pg_ctl`` on ``PATH`` really lives, else from the newest
``/usr/lib/postgresql/*/bin`` (Debian's). PostgreSQL refuses to run as root: as root, the servers
run as the OS user ``postgres``. Usage::

    with PgQuorum() as quorum:
        conn = psycopg.connect(quorum.primary.dsn())
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import psycopg

from benchmarks.peers.pg_server import PgServer
from waltz.local.processes import free_port, wait_until

logger = logging.getLogger(__name__)

#: The directory of the server binaries, when set (e.g. ``/usr/lib/postgresql/15/bin``).
PG_BIN_ENV = "WALTZ_PG_BIN"
#: The standbys' names (their ``application_name``) and the quorum the primary waits for.
STANDBY_NAMES = ("s1", "s2")
SYNCHRONOUS_STANDBY_NAMES = f"ANY 1 ({', '.join(STANDBY_NAMES)})"
#: Seconds for ``initdb`` or ``pg_basebackup`` to finish.
SETUP_TIMEOUT = 120.0
#: Seconds for a server to start (``pg_ctl -w -t``), and for both standbys to reach the quorum.
START_TIMEOUT = 60.0
#: Seconds for a server to stop (``pg_ctl stop -w -t``), per attempt.
STOP_TIMEOUT = 30.0
#: Lines of a server's log quoted in an error.
LOG_TAIL_LINES = 30
_BINARIES = ("initdb", "pg_ctl", "pg_basebackup")


@dataclass(frozen=True)
class _OsUser:
    """The OS user the servers run as, and the ``setpriv`` that switches to it."""

    uid: int
    gid: int
    setpriv: str

    def prefix(self) -> list[str]:
        """The command prefix that runs the rest as this user, with no supplementary groups."""
        return [self.setpriv, f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--"]


class PgQuorumError(RuntimeError):
    """The quorum server could not be made: binaries missing, a server that did not start, or
    standbys that did not reach the quorum; the message says which, with the server's log."""


def find_bindir() -> Path:
    """The directory of PostgreSQL's server binaries.

    Returns:
        ``$WALTZ_PG_BIN`` when set; else the real directory of ``pg_ctl`` on ``PATH``, else the
        newest ``/usr/lib/postgresql/*/bin``: the first that holds ``initdb``, ``pg_ctl`` and
        ``pg_basebackup``.

    Raises:
        PgQuorumError: ``$WALTZ_PG_BIN`` lacks them, or no such directory was found.
    """
    chosen = os.environ.get(PG_BIN_ENV)
    if chosen:
        return check_bindir(Path(chosen), f"{PG_BIN_ENV}={chosen}")
    candidates: list[Path] = []
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)

    def version(path: Path) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", path.parent.name))

    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=version, reverse=True)
    for directory in candidates:
        if not _missing(directory):
            return directory
    raise PgQuorumError(
        f"PostgreSQL's server binaries ({', '.join(_BINARIES)}) were not found on PATH or in "
        f"/usr/lib/postgresql/*/bin: install the server (Debian: apt-get install postgresql) or "
        f"set {PG_BIN_ENV} to their directory"
    )


def check_bindir(directory: Path, what: str | None = None) -> Path:
    """Check that a directory holds the server binaries this module runs.

    Args:
        directory: the directory.
        what: how the caller named it, for the message; the path by default.

    Returns:
        ``directory``.

    Raises:
        PgQuorumError: some of ``initdb``, ``pg_ctl``, ``pg_basebackup`` are missing or not
            executable there.
    """
    missing = _missing(directory)
    if missing:
        raise PgQuorumError(
            f"{what or directory}: no executable {', '.join(missing)} there; point it at the "
            f"directory of PostgreSQL's server binaries (e.g. /usr/lib/postgresql/15/bin)"
        )
    return directory


def _missing(directory: Path) -> list[str]:
    """The server binaries that are not executable files in ``directory``."""
    return [name for name in _BINARIES if not os.access(directory / name, os.X_OK)]


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file, or why there are none."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(no log at {path}: {exc})"
    return "\n".join(text.splitlines()[-lines:])


class PgQuorum:
    """A primary and two synchronous standbys (``ANY 1``) on free loopback ports, in a temporary
    directory, for the life of the context manager.

    Args:
        bindir: the server binaries' directory; :func:`find_bindir` when None.
        start_timeout: seconds for each server to start, and for the standbys to reach the quorum.

    Attributes:
        primary: the primary's connection settings (set by :meth:`start`).
        standbys: the standbys' (hot standbys: they answer reads), in :data:`STANDBY_NAMES` order.
        root: the temporary directory holding the data directories and logs (None once closed).

    Error handling: :meth:`start` stops whatever it started and removes the directory before it
    raises; :meth:`close` is idempotent and logs (never hides) a server that needed killing.
    """

    def __init__(self, bindir: Path | None = None, *, start_timeout: float = START_TIMEOUT) -> None:
        self.bindir = bindir
        self.start_timeout = start_timeout
        self.primary = PgServer(port=0)
        self.standbys: tuple[PgServer, ...] = ()
        self.root: Path | None = None
        self._data_dirs: list[Path] = []
        self._run_as: _OsUser | None = None

    # --- life cycle ---------------------------------------------------------------------------

    def __enter__(self) -> PgQuorum:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> PgServer:
        """Make and start the three servers and wait until both standbys are in the quorum.

        Returns:
            The primary's connection settings (also :attr:`primary`).

        Raises:
            PgQuorumError: the binaries are missing, a command failed, a server did not start
                (with the tail of its log) or the standbys did not reach the quorum in time.
            RuntimeError: already started.
        """
        if self.root is not None:
            raise RuntimeError("this PgQuorum is already started; make another one")
        bindir = check_bindir(self.bindir) if self.bindir else find_bindir()
        self.bindir = bindir
        self._run_as = self._os_user()
        self.root = Path(tempfile.mkdtemp(prefix="waltz-pg-quorum-"))
        try:
            if self._run_as is not None:
                os.chown(self.root, self._run_as.uid, self._run_as.gid)
            self._start_primary(bindir)
            self.standbys = tuple(self._start_standby(bindir, name) for name in STANDBY_NAMES)
            self._wait_for_quorum()
        except BaseException:
            self.close()
            raise
        logger.info("PostgreSQL quorum up: primary %s, standbys %s", self.primary, self.standbys)
        return self.primary

    def close(self) -> None:
        """Stop the three servers (standbys first) and remove the directory; idempotent."""
        root = self.root
        if root is None:
            return
        try:
            for data_dir in reversed(self._data_dirs):
                try:
                    self._stop(data_dir)
                except Exception:  # the next server is stopped all the same
                    logger.exception("stopping the PostgreSQL server in %s failed", data_dir)
        finally:
            self.root = None
            self._data_dirs.clear()
            shutil.rmtree(root, onerror=_log_removal_error)

    # --- the servers --------------------------------------------------------------------------

    @staticmethod
    def _os_user() -> _OsUser | None:
        """The OS user to run the servers as when we are root (PostgreSQL refuses root)."""
        if os.geteuid() != 0:
            return None
        try:
            entry = pwd.getpwnam("postgres")
        except KeyError:
            raise PgQuorumError(
                "running as root, and PostgreSQL refuses to: there is no OS user 'postgres' to run "
                "the servers as (Debian's postgresql package creates it)"
            ) from None
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise PgQuorumError(
                "running as root, the servers run as 'postgres' through setpriv, which is not on "
                "PATH (Debian's util-linux package has it)"
            )
        return _OsUser(uid=entry.pw_uid, gid=entry.pw_gid, setpriv=setpriv)

    def _run(self, command: Sequence[str], timeout: float, log: Path | None = None) -> None:
        """Run a server command as the servers' OS user; raise with its output if it fails.

        The user is switched by ``setpriv`` in the child, not by ``subprocess``'s ``user=``:
        with ``user=`` Python forks instead of using vfork, and a fork in a process whose gRPC
        threads are running (a test worker, the benchmark) runs gRPC's fork handlers, which
        can crash the child before it executes the command (exit code -11).
        """
        assert self.root is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env |= {"HOME": str(self.root), "LC_ALL": "C.UTF-8"}
        argv = [*self._run_as.prefix(), *command] if self._run_as is not None else list(command)
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
                cwd=self.root,
                env=env,
            )
        except subprocess.TimeoutExpired as exc:
            logs = f"\n--- {log}:\n{_tail(log)}" if log else ""
            raise PgQuorumError(f"{' '.join(command)} did not finish within {timeout:g} s{logs}") from exc
        if done.returncode != 0:
            logs = f"\n--- {log}:\n{_tail(log)}" if log else ""
            raise PgQuorumError(
                f"{' '.join(command)} failed (exit code {done.returncode}):\n"
                f"{(done.stdout + done.stderr).strip()[-3000:]}{logs}"
            )

    def _pg_ctl_start(self, bindir: Path, data_dir: Path) -> None:
        """Start a server and wait until it accepts connections (``pg_ctl -w``)."""
        self._data_dirs.append(data_dir)  # stopped on close even if pg_ctl is interrupted
        log = data_dir.with_suffix(".log")
        command = [str(bindir / "pg_ctl"), "-D", str(data_dir), "-l", str(log), "-w"]
        self._run([*command, "-t", f"{self.start_timeout:.0f}", "start"], self.start_timeout + 30, log)

    def _start_primary(self, bindir: Path) -> None:
        assert self.root is not None
        data_dir = self.root / "primary"
        self._run(
            [
                *(str(bindir / "initdb"), "-D", str(data_dir), "-A", "trust", "-U", "postgres"),
                *("-E", "UTF8", "--locale=C", "--no-sync"),
            ],
            SETUP_TIMEOUT,
        )
        self.primary = PgServer(port=free_port())
        _append(
            data_dir / "postgresql.conf",
            {
                "listen_addresses": "'127.0.0.1'",
                "port": str(self.primary.port),
                "unix_socket_directories": f"'{data_dir}'",
                "wal_level": "replica",
                "max_wal_senders": "10",
                "max_replication_slots": "10",
                "synchronous_standby_names": f"'{SYNCHRONOUS_STANDBY_NAMES}'",
                "synchronous_commit": "on",
            },
        )
        with (data_dir / "pg_hba.conf").open("a") as hba:
            hba.write("host replication all 127.0.0.1/32 trust\n")
        self._pg_ctl_start(bindir, data_dir)

    def _start_standby(self, bindir: Path, name: str) -> PgServer:
        assert self.root is not None
        data_dir = self.root / name
        primary = self.primary
        self._run(
            [
                *(str(bindir / "pg_basebackup"), "-h", primary.host, "-p", str(primary.port)),
                *("-U", primary.user, "-D", str(data_dir), "-R", "-X", "stream", "-C", "-S", name),
                "--no-sync",
            ],
            SETUP_TIMEOUT,
        )
        standby = PgServer(port=free_port())
        # The copy has the primary's settings: its own port and socket directory override them,
        # and its own application_name (the name the quorum counts) the connection ``-R`` wrote.
        _append(
            data_dir / "postgresql.conf",
            {"port": str(standby.port), "unix_socket_directories": f"'{data_dir}'", "hot_standby": "on"},
        )
        conninfo = f"host={primary.host} port={primary.port} user={primary.user} application_name={name}"
        _append(data_dir / "postgresql.auto.conf", {"primary_conninfo": f"'{conninfo}'"})
        self._pg_ctl_start(bindir, data_dir)
        return standby

    def replication(self) -> list[tuple[str, str, str]]:
        """The primary's view of its standbys (``pg_stat_replication``).

        Returns:
            ``(application_name, state, sync_state)`` of each connected standby, by name, e.g.
            ``[("s1", "streaming", "quorum"), ("s2", "streaming", "quorum")]``.

        Raises:
            psycopg.OperationalError: the primary is not reachable.
        """
        with psycopg.connect(self.primary.dsn(), autocommit=True, connect_timeout=5) as conn:
            rows = conn.execute(
                "SELECT application_name, state, sync_state FROM pg_stat_replication ORDER BY 1"
            ).fetchall()
        return [(str(name), str(state), str(sync)) for name, state, sync in rows]

    def _wait_for_quorum(self) -> None:
        expected = [(name, "streaming", "quorum") for name in STANDBY_NAMES]
        seen: list[list[tuple[str, str, str]]] = [[]]

        def in_quorum() -> bool:
            seen[0] = self.replication()
            return seen[0] == expected

        try:
            wait_until(in_quorum, timeout=self.start_timeout, what="both standbys in quorum", interval=0.1)
        except TimeoutError as exc:
            assert self.root is not None
            logs = "".join(f"\n--- {d.name}.log:\n{_tail(d.with_suffix('.log'))}" for d in self._data_dirs)
            raise PgQuorumError(
                f"the standbys did not reach the quorum within {self.start_timeout:g} s: "
                f"pg_stat_replication shows {seen[0]}, expected {expected}{logs}"
            ) from exc

    def _stop(self, data_dir: Path) -> None:
        """Stop one server: ``-m fast``, then ``-m immediate``, then SIGKILL its postmaster."""
        if not (data_dir / "postmaster.pid").exists():
            return
        bindir = self.bindir or find_bindir()
        for mode in ("fast", "immediate"):
            command = [str(bindir / "pg_ctl"), "-D", str(data_dir), "-m", mode, "-w"]
            try:
                self._run([*command, "-t", f"{STOP_TIMEOUT:.0f}", "stop"], STOP_TIMEOUT + 15)
                return
            except (PgQuorumError, OSError) as exc:  # OSError: pg_ctl could not be run at all
                logger.warning("stopping the PostgreSQL server in %s (-m %s) failed: %s", data_dir, mode, exc)
        pid = _postmaster_pid(data_dir)
        if pid is not None:
            logger.warning("killing the PostgreSQL postmaster %d of %s", pid, data_dir)
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile: what we wanted
                os.kill(pid, signal.SIGKILL)


def _log_removal_error(function: Any, path: str, exc_info: Any) -> None:
    """``shutil.rmtree``'s error handler: log what could not be removed and go on (a failure to
    remove must not hide the error that ended the run)."""
    logger.warning("could not remove %s (%s): %s", path, getattr(function, "__name__", function), exc_info[1])


def _append(path: Path, settings: dict[str, str]) -> None:
    """Append ``name = value`` lines to a server's configuration file (later lines win)."""
    with path.open("a") as conf:
        conf.write("\n# benchmarks.peers.pg_quorum\n")
        conf.writelines(f"{name} = {value}\n" for name, value in settings.items())


def _postmaster_pid(data_dir: Path) -> int | None:
    """The postmaster's pid from ``postmaster.pid``, or None when there is none."""
    try:
        first = (data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
        return int(first)
    except (OSError, ValueError):
        return None
