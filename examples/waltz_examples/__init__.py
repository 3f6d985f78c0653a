"""Example services built on waltz-py: ``waltz_examples.counter``, ``waltz_examples.ledger`` and
``waltz_examples.wallet``.

The source lives in the repository's top-level ``examples/`` directory; a wheel installs it as the
``waltz_examples`` package (``waltz demo`` and ``waltz chaos --workload ledger`` run the ledger).
"""
