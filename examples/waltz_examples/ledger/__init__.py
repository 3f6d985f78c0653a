"""The ledger example: accounts, transfers and the SmallBank mix on the Waltz SQL framework.

See ``examples/waltz_examples/ledger/README.md``. Modules: ``models`` (tables and entities), ``operations``
(single-partition transaction contexts), ``transfers`` (two-step transfers across partitions and
the sweeper), ``service`` (``LedgerService``), ``smallbank`` (the benchmark mix), ``checks``
(invariants), ``migrations_api`` (its alembic migrations).
"""
