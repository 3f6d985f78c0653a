"""Tests of waltz.local.processes: ports, wait_until, and ManagedProcess's life cycle."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import support

import waltz
import waltz.testing
from waltz.errors import ConfigurationError
from waltz.local.processes import (
    PORT_RANGE_ENV,
    ManagedProcess,
    ServiceStartError,
    free_port,
    port_range,
    wait_for_port,
    wait_until,
)

PYTHON = sys.executable
REPO_ROOT = Path(waltz.__file__).resolve().parents[1]

#: A child that says it is ready (with its PID) and then idles until it is signalled.
SLEEPER = "import os, time; print('ready', os.getpid(), flush=True); time.sleep(120)"


def python(code: str) -> list[str]:
    """Arguments that run ``code`` in a fresh interpreter."""
    return [PYTHON, "-c", textwrap.dedent(code)]


def wait_for_log(process: ManagedProcess, text: str, timeout: float = 10.0) -> str:
    """Wait until a line of the process's log starts with ``text``, and return that line.

    (Lines, not substrings: the header line of each start repeats the command line.)
    """

    def matching_line() -> str | None:
        return next((line for line in process.log_tail(200).splitlines() if line.startswith(text)), None)

    return wait_until(matching_line, timeout=timeout, what=f"a line {text!r}... in the log of {process.name}")


# --- free_port, wait_until, wait_for_port --------------------------------------------------------


def test_free_port_can_be_bound() -> None:
    port = free_port()
    assert 0 < port < 65536
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_free_ports_are_outside_the_range_outgoing_connections_use() -> None:
    # An outgoing connection gets an ephemeral port; a port chosen below that range cannot be
    # taken by one between free_port() and the server's bind (a flake seen in CI).
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(20000 <= port < low for port in ports)
    assert len(ports) > 1


def test_waltz_port_range_bounds_the_ports_drawn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PORT_RANGE_ENV, "24000-24049")
    ports = {free_port() for _ in range(20)}
    assert all(24000 <= port <= 24049 for port in ports)
    assert len(ports) > 1


@pytest.mark.parametrize("text", ["24000", "24000-", "a-b", "30000-20000", "80-90", "60000-70000"])
def test_a_malformed_waltz_port_range_is_refused_with_its_text(
    monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    monkeypatch.setenv(PORT_RANGE_ENV, text)
    with pytest.raises(ConfigurationError, match=f"WALTZ_PORT_RANGE={text!r}: expected LOW-HIGH"):
        free_port()


def test_each_xdist_worker_draws_from_a_slice_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    slices = []
    for worker in ("gw0", "gw1", "gw2"):
        monkeypatch.delenv(PORT_RANGE_ENV, raising=False)
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
        waltz.testing.pytest_configure(pytest.Config.__new__(pytest.Config))
        slices.append(port_range())
    low, high = 20000, int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]) - 1
    assert slices[0][0] == low and slices[-1][1] <= high
    assert all(a[1] < b[0] for a, b in itertools.pairwise(slices))  # disjoint, in order
    assert all(h - lo + 1 == (high - low + 1) // 3 for lo, h in slices)


def test_wait_until_returns_the_first_truthy_value() -> None:
    results = iter([None, 0, "", "found", "later"])
    assert wait_until(lambda: next(results), timeout=5, what="a value", interval=0.01) == "found"


def test_wait_until_accepts_a_boolean_condition() -> None:
    deadline = time.monotonic() + 0.1
    assert wait_until(lambda: time.monotonic() >= deadline, timeout=5, what="the deadline") is True


def test_wait_until_timeout_says_what_it_waited_for() -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"^timed out after 0\.3s waiting for the moon to rise$"):
        wait_until(lambda: False, timeout=0.3, what="the moon to rise")
    assert 0.3 <= time.monotonic() - started < 3


def test_wait_until_timeout_reports_the_last_exception() -> None:
    def refuse() -> bool:
        raise ConnectionRefusedError("port 1 refused")

    with pytest.raises(TimeoutError) as raised:
        wait_until(refuse, timeout=0.2, what="a connection")
    assert str(raised.value) == (
        "timed out after 0.2s waiting for a connection; last error: ConnectionRefusedError('port 1 refused')"
    )
    assert isinstance(raised.value.__cause__, ConnectionRefusedError)


def test_wait_until_retries_exceptions_until_the_condition_holds() -> None:
    attempts: Iterator[OSError | int] = iter([OSError("not yet"), OSError("still not"), 42])

    def condition() -> int:
        value = next(attempts)
        if isinstance(value, Exception):
            raise value
        return value

    assert wait_until(condition, timeout=5, what="the answer", interval=0.01) == 42


def test_wait_until_abort_on_propagates_at_once() -> None:
    def broken() -> bool:
        raise ValueError("bad configuration")

    started = time.monotonic()
    with pytest.raises(ValueError, match="bad configuration"):
        wait_until(broken, timeout=30, what="never", abort_on=(ValueError,))
    assert time.monotonic() - started < 5


def test_wait_for_port_sees_a_listener_and_times_out_without_one() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        wait_for_port("127.0.0.1", port, timeout=5)
    closed_port = free_port()
    with pytest.raises(TimeoutError, match=f"waiting for a TCP listener on 127.0.0.1:{closed_port}"):
        wait_for_port("127.0.0.1", closed_port, timeout=0.3)


# --- ManagedProcess ------------------------------------------------------------------------------


def test_start_logs_output_and_kill_is_sigkill(process_factory: support.ProcessFactory) -> None:
    process = process_factory(python(SLEEPER), name="sleeper")
    assert process.pid is None
    assert process.returncode is None
    assert not process.is_running()

    process.start()
    pid = process.pid
    assert pid is not None
    assert process.is_running()
    assert process.log_path is not None
    assert f"ready {pid}" in wait_for_log(process, "ready")
    assert os.getpgid(pid) == pid  # its own process group

    assert process.kill() == -signal.SIGKILL
    assert not process.is_running()
    assert process.returncode == -signal.SIGKILL
    assert not support.pid_is_alive(pid)


def test_kill_reaches_every_process_of_the_group(process_factory: support.ProcessFactory) -> None:
    process = process_factory(
        python(
            """
            import subprocess, sys, time
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
            print("grandchild", child.pid, flush=True)
            time.sleep(120)
            """
        ),
        name="parent",
    )
    process.start()
    grandchild = int(wait_for_log(process, "grandchild ").split()[1])
    assert support.pid_is_alive(grandchild)

    process.kill()
    wait_until(lambda: not support.pid_is_alive(grandchild), timeout=5, what="the grandchild to die")


def test_terminate_lets_the_process_exit_cleanly(process_factory: support.ProcessFactory) -> None:
    process = process_factory(
        python(
            """
            import signal, sys, time
            def on_term(signum, frame):
                print("terminating", flush=True)
                sys.exit(3)
            signal.signal(signal.SIGTERM, on_term)
            print("ready", flush=True)
            time.sleep(120)
            """
        ),
        name="graceful",
    )
    process.start()
    wait_for_log(process, "ready")
    assert process.terminate(timeout=10) == 3
    assert "terminating" in process.log_tail()


def test_terminate_kills_a_process_that_ignores_sigterm(process_factory: support.ProcessFactory) -> None:
    process = process_factory(
        python(
            """
            import signal, time
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            print("ready", flush=True)
            time.sleep(120)
            """
        ),
        name="stubborn",
    )
    process.start()
    wait_for_log(process, "ready")
    started = time.monotonic()
    assert process.terminate(timeout=0.3) == -signal.SIGKILL
    assert time.monotonic() - started < 5


def test_terminate_reaches_a_paused_process(process_factory: support.ProcessFactory) -> None:
    process = process_factory(
        python(
            """
            import signal, sys, time
            signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(3))
            print("ready", flush=True)
            time.sleep(120)
            """
        ),
        name="paused",
    )
    process.start()
    wait_for_log(process, "ready")
    process.pause()
    assert process.terminate(timeout=10) == 3  # SIGCONT follows SIGTERM, so the handler runs


def test_pause_stops_and_resume_continues_the_process(process_factory: support.ProcessFactory) -> None:
    process = process_factory(python(SLEEPER), name="sleeper")
    process.start()
    pid = process.pid
    assert pid is not None
    wait_for_log(process, "ready")

    process.pause()
    wait_until(lambda: support.pid_state(pid) == "T", timeout=5, what="the process to stop")
    assert process.is_running()  # paused is not exited
    process.resume()
    wait_until(lambda: support.pid_state(pid) in ("S", "R"), timeout=5, what="the process to continue")


def test_pause_of_a_process_that_is_not_running_raises(process_factory: support.ProcessFactory) -> None:
    process = process_factory(python(SLEEPER), name="never-started")
    with pytest.raises(RuntimeError, match="cannot pause never-started: it is not running"):
        process.pause()
    process.resume()  # no effect, no error


def test_start_again_after_exit_runs_the_same_command(process_factory: support.ProcessFactory) -> None:
    process = process_factory(python(SLEEPER), name="phoenix")
    process.start()
    first_pid = process.pid
    wait_for_log(process, f"ready {first_pid}")
    process.kill()

    process.start()
    assert process.is_running()
    assert process.pid != first_pid
    wait_for_log(process, f"ready {process.pid}")
    tail = process.log_tail()
    assert f"ready {first_pid}" in tail  # the log is appended to, not replaced
    assert tail.count("starting phoenix") == 2


def test_start_while_running_raises(process_factory: support.ProcessFactory) -> None:
    process = process_factory(python(SLEEPER), name="busy")
    process.start()
    with pytest.raises(RuntimeError, match="busy is already running"):
        process.start()


def test_context_manager_starts_and_kills(tmp_path: Path) -> None:
    with ManagedProcess(python(SLEEPER), name="scoped", log_path=tmp_path / "scoped.log") as process:
        assert process.is_running()
        pid = process.pid
    assert not process.is_running()
    assert process.returncode == -signal.SIGKILL
    assert pid is not None
    assert not support.pid_is_alive(pid)
    process.close()  # idempotent
    process.close()


def test_close_of_a_process_never_started_does_nothing() -> None:
    process = ManagedProcess(python(SLEEPER), name="idle")
    process.close()
    assert process.kill() is None
    assert process.terminate() is None


def test_env_and_cwd_reach_the_child(process_factory: support.ProcessFactory, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    process = process_factory(
        python("import os; print('env', os.environ['WALTZ_PROBE'], 'cwd', os.getcwd(), flush=True)"),
        name="probe",
        env={"WALTZ_PROBE": "hello", "PATH": os.environ.get("PATH", "")},
        cwd=workdir,
    )
    process.start()
    assert process.wait(timeout=10) == 0
    assert f"env hello cwd {workdir}" in process.log_tail()


def test_wait_times_out_on_a_running_process(process_factory: support.ProcessFactory) -> None:
    process = process_factory(python(SLEEPER), name="sleeper")
    process.start()
    with pytest.raises(TimeoutError, match=r"timed out after 0\.2s waiting for sleeper \(pid \d+\) to exit"):
        process.wait(timeout=0.2)


def test_log_tail_returns_the_last_lines(process_factory: support.ProcessFactory) -> None:
    process = process_factory(python("for i in range(100): print('line', i)"), name="chatty")
    process.start()
    assert process.wait(timeout=10) == 0
    assert process.log_tail(3) == "line 97\nline 98\nline 99"


def test_log_tail_without_a_log_file() -> None:
    process = ManagedProcess(python(SLEEPER), name="quiet")
    assert "quiet is discarded" in process.log_tail()


def test_a_missing_program_raises_on_start(tmp_path: Path) -> None:
    process = ManagedProcess([str(tmp_path / "no-such-program")], name="ghost", log_path=tmp_path / "g.log")
    with pytest.raises(FileNotFoundError):
        process.start()
    assert not process.is_running()
    process.close()


def test_empty_args_are_rejected() -> None:
    with pytest.raises(ValueError, match="non-empty sequence"):
        ManagedProcess([], name="nothing")


def test_wait_ready_fails_at_once_when_the_process_exits(process_factory: support.ProcessFactory) -> None:
    process = process_factory(python("import sys; print('boom: bad config'); sys.exit(5)"), name="crasher")
    process.start()
    started = time.monotonic()
    with pytest.raises(ServiceStartError) as raised:
        process.wait_ready(lambda: False, timeout=30, what="the crasher to answer")
    assert time.monotonic() - started < 10
    message = str(raised.value)
    assert "crasher exited with code 5 while waiting for the crasher to answer" in message
    assert "boom: bad config" in message


def test_wait_ready_timeout_shows_the_log(process_factory: support.ProcessFactory) -> None:
    process = process_factory(python(SLEEPER), name="slowpoke")
    process.start()
    wait_for_log(process, "ready")
    with pytest.raises(ServiceStartError) as raised:
        process.wait_ready(lambda: None, timeout=0.2, what="an answer")
    message = str(raised.value)
    assert "slowpoke" in message
    assert "timed out after 0.2s waiting for an answer" in message
    assert f"ready {process.pid}" in message
    assert isinstance(raised.value.__cause__, TimeoutError)


def test_wait_ready_returns_the_condition_value(process_factory: support.ProcessFactory) -> None:
    process = process_factory(python(SLEEPER), name="sleeper")
    process.start()
    tail = process.wait_ready(
        lambda: t if "\nready" in (t := process.log_tail()) else None, timeout=10, what="ready"
    )
    assert f"\nready {process.pid}" in tail


# --- the atexit safety net -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "ending",
    [
        "pass",
        "raise SystemExit(4)",
        "raise RuntimeError('the parent crashed')",
        "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
    ],
    ids=["normal-exit", "sys-exit", "uncaught-exception", "killed"],
)
def test_processes_left_running_are_killed_at_interpreter_exit(ending: str, tmp_path: Path) -> None:
    """However the interpreter ends, ``kill -9`` too (no atexit then: the kernel kills the child)."""
    script = textwrap.dedent(
        f"""
        import sys
        from waltz.local.processes import ManagedProcess
        forgotten = ManagedProcess(
            [sys.executable, "-c", "import time; time.sleep(120)"], name="forgotten"
        )
        forgotten.start()
        print(forgotten.pid, flush=True)
        {ending}
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [PYTHON, "-c", script], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert result.stdout.strip().isdigit(), result.stderr
    orphan = int(result.stdout)
    try:
        wait_until(
            lambda: not support.pid_is_alive(orphan), timeout=5, what=f"the forgotten child {orphan} to die"
        )
    finally:
        if support.pid_is_alive(orphan):  # the safety net failed: do not leak the child
            os.kill(orphan, signal.SIGKILL)


def test_a_process_started_by_a_thread_that_ends_keeps_running(
    process_factory: support.ProcessFactory,
) -> None:
    """The child dies with the interpreter, not with the thread that started it (a fault
    injector's thread restarts servers, then ends)."""
    process = process_factory(python(SLEEPER), name="started-by-a-thread")
    starter = threading.Thread(target=process.start)
    starter.start()
    starter.join(30)
    assert not starter.is_alive()
    assert "ready" in wait_for_log(process, "ready")
    with pytest.raises(TimeoutError):
        process.wait(1.0)  # the thread's end killed nothing
    assert process.is_running()
