"""The operators' web console of a cluster (``waltz console``; docs/console.md).

Design: docs/design/console.md "What the console is". Modules: :mod:`~waltz.console.config`
(settings), :mod:`~waltz.console.cluster_map` (the map, joined from the admin tools' reads and
probes), :mod:`~waltz.console.zookeeper_health`, :mod:`~waltz.console.metrics` (scrapes, rates,
quantiles, chart series), :mod:`~waltz.console.observer` (the periodic look),
:mod:`~waltz.console.actions` (operator actions and their confirmations),
:mod:`~waltz.console.app` (the Starlette application) and :mod:`~waltz.console.server` (uvicorn).
It needs the ``console`` extra: ``pip install 'waltz-py[console]'``.
"""
