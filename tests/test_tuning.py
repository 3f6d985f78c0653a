"""waltz.tuning's gRPC settings: known to the pinned grpcio, set only where they take effect.

gRPC core reads ``GRPC_EXPERIMENTS`` and ``GRPC_ENABLE_FORK_SUPPORT`` once, when ``grpc`` is
imported, so each case runs in a fresh interpreter of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from waltz.local.processes import free_port
from waltz.tuning import GRPC_ENVIRONMENT, GRPC_EXPERIMENTS, GRPC_FORK_SUPPORT

#: A channel and a listener, each carrying one stream message: the code paths both experiments
#: switch (client channels, listeners).
_ECHO = """
import asyncio
import grpc
from grpc import aio

async def main():
    async def echo(requests, context):
        async for message in requests:
            yield message

    handler = grpc.stream_stream_rpc_method_handler(echo)
    server = aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.Echo", {"S": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream("/t.Echo/S")()
        await call.write(b"ping")
        assert await call.read() == b"ping"
        await call.done_writing()
    await server.stop(None)
    print("echoed")

asyncio.run(main())
"""


#: The variables waltz.tuning sets: the tests start from an environment without them.
_SETTINGS = tuple(GRPC_ENVIRONMENT)


def _python(code: str, env: dict[str, str | None]) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k not in _SETTINGS}
    environment.update({k: v for k, v in env.items() if v is not None})
    return subprocess.run(
        [sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=60, check=False
    )


def test_the_pinned_grpcio_knows_both_experiments_and_carries_a_stream_without_them() -> None:
    result = _python(_ECHO, {"GRPC_EXPERIMENTS": GRPC_EXPERIMENTS})

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "echoed"
    assert "Unknown experiment" not in result.stderr, result.stderr


def test_an_experiment_grpcio_does_not_know_is_reported() -> None:
    # What the check above would see after an upgrade that dropped an experiment.
    result = _python(_ECHO, {"GRPC_EXPERIMENTS": "-no_such_waltz_experiment"})

    assert result.returncode == 0, result.stderr
    assert "Unknown experiment: no_such_waltz_experiment" in result.stderr


_TUNE = """
import os, sys
{before}
from waltz.tuning import {tune}, {in_effect}
tuned = {tune}()
print(tuned, repr(os.environ.get("{variable}")), {in_effect}(), sep="|")
"""

_TRANSPORT = ("tune_grpc_transport", "grpc_experiments_in_effect", "GRPC_EXPERIMENTS")
_FORK = ("tune_grpc_fork_support", "grpc_fork_support_in_effect", "GRPC_ENABLE_FORK_SUPPORT")


@pytest.mark.parametrize(
    ("function", "before", "env", "expected"),
    [
        (_TRANSPORT, "", None, f"True|'{GRPC_EXPERIMENTS}'|{GRPC_EXPERIMENTS}"),
        (_TRANSPORT, "", "-event_engine_dns", "False|'-event_engine_dns'|-event_engine_dns"),
        (_TRANSPORT, "", "", "False|''|(gRPC's defaults)"),
        (_TRANSPORT, "import grpc", None, "False|None|(gRPC's defaults)"),
        (_FORK, "", None, f"True|'{GRPC_FORK_SUPPORT}'|{GRPC_FORK_SUPPORT}"),
        (_FORK, "", "true", "False|'true'|true"),
        (_FORK, "import grpc", None, "False|None|(gRPC's default)"),
    ],
    ids=[
        "transport: unset",
        "transport: the operator's own",
        "transport: empty, gRPC's defaults",
        "transport: grpc already imported",
        "fork support: unset",
        "fork support: the operator's own",
        "fork support: grpc already imported",
    ],
)
def test_each_setting_is_set_only_before_grpc_and_never_over_the_operators(
    function: tuple[str, str, str], before: str, env: str | None, expected: str
) -> None:
    tune, in_effect, variable = function
    code = _TUNE.format(before=before, tune=tune, in_effect=in_effect, variable=variable)
    result = _python(code, {variable: env})

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


@pytest.mark.parametrize("entry", ["waltz.services.storage", "waltz.services.server", "waltz"])
def test_each_entry_point_tunes_grpc_before_importing_it(entry: str) -> None:
    # What `python -m <entry>` runs first, with the import of grpc recorded: the variable must be
    # set by the time grpc is imported.
    code = f"""
import builtins, os, runpy, sys
seen = []
real_import = builtins.__import__
def spy(name, *args, **kwargs):
    if name.split(".")[0] == "grpc" and not seen:
        seen.append((os.environ.get("GRPC_EXPERIMENTS"), os.environ.get("GRPC_ENABLE_FORK_SUPPORT")))
    return real_import(name, *args, **kwargs)
builtins.__import__ = spy
sys.argv = ["{entry}", "--help"]
try:
    runpy.run_module("{entry}", run_name="__main__", alter_sys=True)
except SystemExit:
    pass
print(seen)
"""
    result = _python(code, {"COLUMNS": "200"})

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == repr([(GRPC_EXPERIMENTS, GRPC_FORK_SUPPORT)])


def test_the_waltz_console_script_is_the_entry_point_that_tunes_first() -> None:
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())

    assert pyproject["project"]["scripts"]["waltz"] == "waltz.cli.entry:main"


#: A process with gRPC threads at work that runs another program the way Spark's launcher does:
#: ``subprocess`` with ``preexec_fn``, which forks rather than vforks. It prints each child's exit
#: code: with gRPC's default the handlers at times kill the child (SIGABRT, -6) before it runs.
_FORK_BESIDE_GRPC = """
import subprocess, time
from waltz.tuning import tune_grpc_fork_support
{tune}
import grpc
channel = grpc.insecure_channel("127.0.0.1:{port}")  # nothing listens: gRPC keeps reconnecting
grpc.channel_ready_future(channel)
time.sleep(0.3)
codes = [subprocess.run(["true"], preexec_fn=lambda: None, check=False).returncode for _ in range(5)]
channel.close()
print("exit codes:", codes)
"""


@pytest.mark.parametrize("tuned", [True, False], ids=["tuned", "gRPC's default"])
def test_a_fork_to_run_a_program_is_quiet_and_safe_with_the_handlers_off(tuned: bool) -> None:
    # The control, gRPC's default, shows that the line this keeps out of `waltz demo` is real.
    code = _FORK_BESIDE_GRPC.format(port=free_port(), tune="tune_grpc_fork_support()" if tuned else "")
    result = _python(code, {})

    assert result.returncode == 0, result.stderr
    forks = [line for line in result.stderr.splitlines() if "fork_posix" in line]
    if tuned:
        assert result.stdout.strip() == "exit codes: [0, 0, 0, 0, 0]", result.stderr
        assert forks == [], result.stderr
    else:
        assert result.stdout.startswith("exit codes:"), result.stderr
        assert forks, result.stderr
