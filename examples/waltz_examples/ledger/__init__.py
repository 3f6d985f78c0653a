"""The ledger example: accounts, transfers and SmallBank's transactions on the Waltz SQL framework.

See ``examples/waltz_examples/ledger/README.md``. Modules: ``models`` (tables and entities), ``operations``
(single-partition transaction contexts), ``transfers`` (two-step transfers across partitions and
the sweeper), ``service`` (``LedgerService``), ``checks`` (invariants), ``migrations_api`` (its
alembic migrations). The SmallBank mix, the demo and ``waltz perf smallbank`` that run it are in
:mod:`waltz.workloads`.
"""
