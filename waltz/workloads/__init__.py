"""The workloads the tools run: the SmallBank mix (``waltz demo``, ``waltz perf smallbank``, ``waltz chaos``).

- :mod:`waltz.workloads.smallbank`: the SmallBank mix and its driver.
- :mod:`waltz.workloads.demo`: the demo behind ``waltz demo``.
- :mod:`waltz.workloads.perf`: ``waltz perf smallbank``, the mix from N instance processes.
"""
