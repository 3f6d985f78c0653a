"""``python -m waltz.services.server``: the same as ``waltz server start``."""

import sys

from waltz.cli.main import main

if __name__ == "__main__":
    main(["server", "start", *sys.argv[1:]])
