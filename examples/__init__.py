"""Example services built on waltz-py: ``examples.counter`` and ``examples.ledger`` (see their READMEs)."""
