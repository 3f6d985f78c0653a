"""The workloads the tools run: SmallBank against an application (docs/design/overview.md, "Workloads").

``waltz demo``, ``waltz perf smallbank`` and ``waltz chaos --workload ledger`` drive an
application found by its module's name (``--app``, the ledger example by default):

- :mod:`waltz.workloads.application`: the interface an application offers, and how it is found;
- :mod:`waltz.workloads.smallbank`: the SmallBank mix and its driver;
- :mod:`waltz.workloads.checks`: the checks of a quiet run, the application's own invariants among
  them;
- :mod:`waltz.workloads.demo`: the demo behind ``waltz demo``;
- :mod:`waltz.workloads.perf`: ``waltz perf smallbank``, the mix from N instance processes.

Importing this package imports none of them (the CLI loads each when its command runs).
"""
