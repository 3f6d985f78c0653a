"""Where the packages of the wheel come from (the rest of the metadata is in pyproject.toml).

Two directories of the repository's top level are installed under names of ours:
``migrations/`` (the SQL framework's alembic environment) as ``waltz.jdbc_style.migrations``, and
the example services of ``examples/`` as ``waltz_examples``. pyproject.toml alone cannot map a
directory found outside the package tree, hence this file.
"""

from setuptools import find_namespace_packages, find_packages, setup

setup(
    packages=[
        *find_packages(include=["waltz", "waltz.*"]),
        # The ledger ships its own alembic environment (a directory without __init__.py).
        *find_namespace_packages("examples", include=["waltz_examples", "waltz_examples.*"]),
        "waltz.jdbc_style.migrations",
        "waltz.jdbc_style.migrations.versions",
        # The console's pages and browser files (directories of data, without __init__.py).
        "waltz.console.static",
        "waltz.console.templates",
    ],
    package_dir={
        "waltz_examples": "examples/waltz_examples",
        "waltz.jdbc_style.migrations": "migrations",
    },
)
