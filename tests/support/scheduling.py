"""How the test run's xdist workers share the tests (docs/decisions/0059-the-suite-in-two-workers.md).

``scripts/test`` runs ``--dist loadgroup``; the suite's conftest then hands pytest-xdist
:class:`SparkGroupScheduling`: xdist's own load-group scheduling, but with every test of
``tests/spark`` in one group, so one worker runs them all, in one JVM and in the order of their
modules, and the tests of a module that holds a fixed address in one group too, while every other
test goes to whichever worker is free. Several Spark JVMs on the run's two cores took 3.9 times
the test time of one.

The group is decided from the test's node ID, which the controller has, and not from an
``xdist_group`` mark: xdist tells the controller a mark's group by rewriting the node ID in the
worker, which pytest's structured node IDs no longer let it do (pytest 9.2 with xdist 3.8), so
marks set no group with the pytest this suite installs.
"""

from __future__ import annotations

from xdist.scheduler import LoadGroupScheduling

__all__ = [
    "SHARED_ADDRESS_GROUP",
    "SHARED_ADDRESS_MODULES",
    "SPARK_GROUP",
    "SPARK_TESTS",
    "SparkGroupScheduling",
]

#: The node ID prefix of the tests that go to one worker.
SPARK_TESTS = "tests/spark/"
#: Their group's name.
SPARK_GROUP = "spark"
#: Modules whose tests make network-namespace hosts on the machine's addresses under
#: ``10.77.0.0/16`` (the deployment guide's fixed ``10.77.0.0/24``; the labs' free /24s): one worker
#: runs them all, one after the other, since two labs made side by side may both find the same /24
#: free before either takes it.
SHARED_ADDRESS_MODULES = (
    "tests/local/test_deploy_guide.py",
    "tests/local/test_netns_lab.py",
    "tests/local/test_netns_split_brain.py",
    "tests/local/test_netns_addresses.py",
    "tests/local/test_local_cluster_namespaces.py",
    "tests/cli/test_up_namespaces.py",
    "tests/chaos/test_chaos_namespaces.py",
)
#: Their group's name.
SHARED_ADDRESS_GROUP = "network-namespaces"


class SparkGroupScheduling(LoadGroupScheduling):
    """Load-group scheduling with the tests of ``tests/spark`` in one group and those of the
    modules of :data:`SHARED_ADDRESS_MODULES` in another; every other test is a scope
    of its own (or of its ``xdist_group``, where xdist can still mark one)."""

    def _split_scope(self, nodeid: str) -> str:
        if nodeid.startswith(SPARK_TESTS):
            return SPARK_GROUP
        module = nodeid.split("::", 1)[0]
        if module in SHARED_ADDRESS_MODULES:
            return SHARED_ADDRESS_GROUP
        return super()._split_scope(nodeid)
