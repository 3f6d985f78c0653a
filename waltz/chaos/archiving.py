"""The archiver of a ``waltz chaos --archive`` run: a ``waltz archive run --follow`` process of its own.

docs/chaos.md "Archiving under faults". The storage nodes of such a run roll small segments and
delete archived ones (:data:`RETENTION_ENV`); :class:`ChaosArchiver` runs the archiver on them
with small chunks and a short seal time, so that it archives, and the nodes delete, all through
the run. It can be killed (``kill -9``) and started again, and it reports each chunk it writes,
so that a fault can strike while an archive round is in progress
(:meth:`ChaosArchiver.wait_for_chunk`).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Self

from waltz.local.cluster import LocalCluster
from waltz.local.processes import spawn_tied

__all__ = ["CHUNK_TRANSACTIONS", "RETENTION_ENV", "ChaosArchiver"]

log = logging.getLogger(__name__)

#: Storage settings of an archiving run: 16 KiB segments, deleted once archived, the 2 newest kept.
RETENTION_ENV = {
    "WALTZ_STORAGE_SEGMENT_SIZE_THRESHOLD": "16384",
    "WALTZ_STORAGE_RETENTION_POLICY": "archived",
    "WALTZ_STORAGE_RETENTION_KEEP_SEGMENTS": "2",
    "WALTZ_STORAGE_RETENTION_KEEP_SECONDS": "0",
    "WALTZ_STORAGE_RETENTION_CHECK_INTERVAL": "0.5",
}
#: Records of a full chunk (a chunk is also sealed after :data:`SEAL_AFTER` quiet seconds).
CHUNK_TRANSACTIONS = 200
#: Seconds of quiet after which a partition's shorter chunk is written.
SEAL_AFTER = 1.0
#: Seconds between two rounds of the archiver.
INTERVAL = 0.5
#: Seconds between two looks at the stop event while :meth:`ChaosArchiver.wait_for_chunk` waits.
_STOP_CHECK = 0.1
#: What the archiver prints for each chunk it writes, adopts or replaces.
_CHUNK_LINE_MARKS = ("chunk written", "chunk adopted", "chunk replaced")


class ChaosArchiver:
    """A ``waltz archive run --follow`` process on a chaos cluster, restartable, its output logged.

    Its output goes to ``log_path`` (appended across restarts); a reader thread counts the chunk
    lines in it. A context manager: leaving it stops the process (SIGTERM, then ``kill -9``).

    Args:
        cluster: the cluster (its ZooKeeper connect string, root and credential).
        location: the archive's directory.
        log_path: where the archiver's output goes.
    """

    def __init__(self, cluster: LocalCluster, location: Path, log_path: Path) -> None:
        self.location = location
        self.log_path = log_path
        self._cluster = cluster
        self._process: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._chunks = 0
        self._starts = 0
        self._condition = threading.Condition()
        # Set while the process is down on purpose (killed by a fault, stopped at the end).
        self._ended_on_purpose = False

    @property
    def chunks(self) -> int:
        """Chunk lines (written, adopted, replaced) the archiver printed so far, over every start."""
        with self._condition:
            return self._chunks

    @property
    def starts(self) -> int:
        """How many times the process was started."""
        return self._starts

    @property
    def running(self) -> bool:
        """Whether the process runs."""
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the archiver (a no-op while it runs)."""
        if self.running:
            return
        self._ended_on_purpose = False
        command = [
            sys.executable, "-m", "waltz", "archive", "run", "--to", str(self.location), "--follow",
            "--chunk-transactions", str(CHUNK_TRANSACTIONS), "--seal-after", f"{SEAL_AFTER:g}",
            "--interval", f"{INTERVAL:g}", "--zookeeper", self._cluster.zookeeper_connect_string,
            "--root", self._cluster.root, "--log-level", "INFO",
        ]  # fmt: skip
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._process = spawn_tied(  # it dies with the run, even when the run is killed
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self._cluster.admin_env("admin")},  # archived-through is an admin write
        )
        self._starts += 1
        assert self._process.stdout is not None
        self._reader = threading.Thread(
            target=self._read_output, args=(self._process.stdout,), name="chaos-archiver-output", daemon=True
        )
        self._reader.start()

    def kill(self) -> None:
        """``kill -9`` the archiver, wherever it is in its round."""
        self._ended_on_purpose = True
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGKILL)
            self._process.wait(30)
        self._join_reader()

    def restart(self) -> None:
        """Start the archiver again after :meth:`kill` (it goes on where its manifest says)."""
        self.kill()
        self.start()

    def stop(self, timeout: float = 60.0) -> int | None:
        """Stop the archiver with SIGTERM (it finishes the chunk in progress); ``kill -9`` after ``timeout``.

        Returns:
            The process's exit code (None: it was never started).
        """
        process = self._process
        if process is None:
            return None
        self._ended_on_purpose = True
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("the archiver did not stop within %gs of SIGTERM: killing it", timeout)
                process.kill()
                process.wait(30)
        self._join_reader()
        return process.returncode

    def failure(self) -> str | None:
        """Why the archiver exited on its own (an error: ``--follow`` runs until stopped), or None
        while it runs, before it started, or when it was killed or stopped on purpose.

        Returns:
            A sentence with its exit code and the last lines of its output.
        """
        process = self._process
        if process is None or self._ended_on_purpose or process.poll() is None:
            return None
        self._join_reader()  # its last lines are in the log once the reader has them
        try:
            tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-20:])
        except OSError:
            tail = "(no output)"
        return (
            f"the archiver exited on its own with code {process.returncode}; its output "
            f"({self.log_path}) ends with:\n{tail}"
        )

    def wait_for_chunk(self, timeout: float, stop: threading.Event | None = None) -> bool:
        """Wait until the archiver reports a chunk after this call: a round is then in progress.

        After a chunk line the archiver adds the chunk to the manifest, raises ZooKeeper's
        archived-through, tells the replicas, then reads the partition's next chunk or goes on to
        the next partition.

        Args:
            timeout: seconds to wait at most.
            stop: ends the wait as soon as it is set (within :data:`_STOP_CHECK` seconds): the
                run is stopping (docs/chaos.md "Archiving under faults").

        Returns:
            True when a chunk was reported within ``timeout`` seconds; False after ``timeout``
            seconds, or once ``stop`` is set.
        """
        deadline = time.monotonic() + timeout
        with self._condition:
            seen = self._chunks
            while self._chunks == seen:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (stop is not None and stop.is_set()):
                    return False
                self._condition.wait(min(remaining, _STOP_CHECK) if stop is not None else remaining)
        return True

    def close(self) -> None:
        """Stop the archiver if it runs (idempotent)."""
        self.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read_output(self, stream: IO[bytes]) -> None:
        with stream, self.log_path.open("ab") as out:
            out.write(f"--- archiver start {self._starts} at {time.strftime('%X')} ---\n".encode())
            for line in stream:
                out.write(line)
                out.flush()
                if any(mark.encode() in line for mark in _CHUNK_LINE_MARKS):
                    with self._condition:
                        self._chunks += 1
                        self._condition.notify_all()

    def _join_reader(self) -> None:
        if self._reader is not None:
            self._reader.join(30)
            self._reader = None
