"""What keeps network labs apart: a taken subnet is refused, routing tables of any shape are read,
and a crashed run's processes do not outlive its namespaces. Needs root and iproute2."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from waltz.local.netns import NetworkLab, NetworkLabError, network_lab_unavailable, unused_subnet
from waltz.local.processes import wait_until

pytestmark = pytest.mark.skipif(network_lab_unavailable() is not None, reason=str(network_lab_unavailable()))


def test_a_lab_on_a_subnet_another_lab_holds_is_refused_and_leaves_the_first_alone() -> None:
    NetworkLab.cleanup_stale()
    subnet = unused_subnet()
    with NetworkLab(["a"], subnet=subnet) as first:
        assert unused_subnet() != subnet  # the first lab's bridge address counts
        second = NetworkLab(["b"], subnet=subnet)
        with pytest.raises(NetworkLabError, match=f"subnet {subnet} overlaps"):
            second.start()
        second.close()
        namespaces = subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True, check=True
        ).stdout
        assert first.host("a").namespace in namespaces
    assert unused_subnet() == subnet


def test_unused_subnet_reads_blackhole_and_multipath_routes() -> None:
    """In a network namespace of its own (``unshare -n``), with routes that have no plain prefix."""
    script = textwrap.dedent(
        """
        import subprocess
        from waltz.local.netns import unused_subnet
        for command in (
            "ip link set lo up",
            "ip route add blackhole 10.77.0.0/24",
            "ip link add d0 type veth peer name d1",
            "ip link set d1 up",
            "ip link set d0 up",
            "ip addr add 10.99.0.1/24 dev d0",
            "ip route add 10.77.2.0/24 nexthop via 10.99.0.2 dev d0 nexthop via 10.99.0.3 dev d0",
        ):
            subprocess.run(command.split(), check=True)
        print(unused_subnet(within="10.77.0.0/16"))
        """
    )
    done = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "10.77.1.0/24"  # 10.77.0.0/24 is the blackhole's


def test_cleanup_of_a_crashed_run_kills_what_still_ran_in_its_namespaces() -> None:
    crashed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, subprocess; from waltz.local.netns import NetworkLab, unused_subnet; "
            "lab = NetworkLab(['x'], subnet=unused_subnet()); lab.start(); "
            "p = subprocess.Popen([*lab.command_prefix('x'), 'sleep', '600'], start_new_session=True, "
            "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
            "print(p.pid, flush=True); os._exit(0)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    orphan = int(crashed.stdout.strip())
    assert _alive(orphan)
    NetworkLab.cleanup_stale()
    wait_until(lambda: not _alive(orphan), timeout=10, what=f"process {orphan} of the crashed lab to be gone")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
