"""``python -m waltz.services.storage``: the same as ``waltz storage start``.

It runs the ``waltz storage`` sub-command alone, without importing every other command of
``waltz`` (the SQL framework, alembic, Spark's helpers): the process starts in a third of the time.
"""

import sys

from waltz.cli import run_start_command
from waltz.cli.storage import app

if __name__ == "__main__":
    run_start_command(app, "waltz storage", sys.argv[1:])
