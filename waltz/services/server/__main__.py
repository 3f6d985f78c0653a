"""``python -m waltz.services.server``: the same as ``waltz server start``.

It runs the ``waltz server`` sub-command alone, without importing every other command of
``waltz`` (the SQL framework, alembic, Spark's helpers): the process starts in a third of the time.
"""

import sys

from waltz.cli import run_start_command
from waltz.cli.server import app

if __name__ == "__main__":
    run_start_command(app, "waltz server", sys.argv[1:])
