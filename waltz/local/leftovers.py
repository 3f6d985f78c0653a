"""The processes a local cluster started, noted in its work directory, and those a crashed run left.

Design: docs/design/overview.md, "Processes and links": every node of a local cluster is an OS
process of its own. A cluster notes each one it starts (name, PID, and the kernel's start time of
the process, so that a PID used again by another program is never taken for it) in
``<work dir>/processes.json``. The next cluster on that work directory holds the directory's lock,
so no supervisor that runs owns the processes still noted there: :func:`stop_leftovers` kills
them, as namespace mode kills the processes left in a crashed run's namespaces
(:meth:`~waltz.local.netns.NetworkLab.cleanup_stale`). Such leftovers hold the ports and the
storage directories the new nodes need (docs/local-cluster.md, "`waltz up`").
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
from collections.abc import Iterable
from pathlib import Path
from typing import TypedDict

from waltz.local.processes import ManagedProcess, wait_until
from waltz.private_files import write_private

__all__ = ["PROCESSES_FILE", "note_processes", "stop_leftovers"]

log = logging.getLogger(__name__)

#: The file of a work directory that lists the processes its cluster started.
PROCESSES_FILE = "processes.json"
#: Seconds :func:`stop_leftovers` waits for the processes it killed to be gone.
_GONE_TIMEOUT = 10.0


class _Noted(TypedDict):
    name: str
    pid: int
    start_time: int


def _start_time(pid: int) -> int | None:
    """The kernel's start time of a running process (``/proc/<pid>/stat`` field 22, in clock
    ticks since boot), or None when no such process runs (an exited one, a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the command name, in parentheses, may hold spaces
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _read(path: Path) -> list[_Noted]:
    """The processes noted in ``path``; none when it is missing or unreadable (said in the log)."""
    try:
        raw = json.loads(path.read_text())
        return [_Noted(name=str(e["name"]), pid=int(e["pid"]), start_time=int(e["start_time"])) for e in raw]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, TypeError, KeyError) as exc:
        log.warning("ignoring %s, which cannot be read: %s", path, exc)
        return []


def _alive(noted: _Noted) -> bool:
    """Whether the process noted still runs (the same process: same PID, same start time)."""
    return _start_time(noted["pid"]) == noted["start_time"]


def _threads_left(pid: int) -> bool:
    """Whether a thread of ``pid`` has not exited yet: its leader may be a zombie while the others
    still exit, holding the process's sockets open until the last one is gone."""
    for task in Path(f"/proc/{pid}/task").glob("[0-9]*/stat"):
        try:
            state = task.read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # gone meanwhile
        if state not in ("Z", "X"):
            return True
    return False


def note_processes(work_dir: Path, processes: Iterable[ManagedProcess]) -> None:
    """Add the running ones of ``processes`` to the work directory's list of processes, and drop
    from it the processes that no longer run.

    Raises:
        OSError: the file cannot be written.
    """
    path = work_dir / PROCESSES_FILE
    noted = [n for n in _read(path) if _alive(n)]
    known = {(n["pid"], n["start_time"]) for n in noted}
    for process in processes:
        pid = process.pid
        start_time = _start_time(pid) if pid is not None and process.is_running() else None
        if pid is not None and start_time is not None and (pid, start_time) not in known:
            noted.append(_Noted(name=process.name, pid=pid, start_time=start_time))
            known.add((pid, start_time))
    write_private(path, json.dumps(noted, indent=2) + "\n")


def stop_leftovers(work_dir: Path) -> list[str]:
    """Kill (SIGKILL, with its process group) every process the work directory's list names that
    still runs, and empty the list. Call it holding the work directory's lock: no running
    supervisor owns these processes then.

    Returns:
        Each process killed, as ``<name> (pid <pid>)``; each is also logged as a warning.

    Raises:
        TimeoutError: a process killed was still there after 10 s.
    """
    path = work_dir / PROCESSES_FILE
    left = [n for n in _read(path) if _alive(n)]
    for noted in left:
        pid = noted["pid"]
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(pid) == pid:  # a node leads a process group of its own
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        log.warning(
            "killed %s (pid %d), left running by an earlier run of the local cluster in %s",
            noted["name"],
            pid,
            work_dir,
        )
    wait_until(
        lambda: not any(_threads_left(n["pid"]) for n in left),
        timeout=_GONE_TIMEOUT,
        what=f"the processes an earlier run left in {work_dir} to exit",
    )
    path.unlink(missing_ok=True)
    return [f"{n['name']} (pid {n['pid']})" for n in left]
