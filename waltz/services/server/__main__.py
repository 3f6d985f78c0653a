"""``python -m waltz.services.server``: the same as ``waltz server start``."""

import sys

from waltz.services.server.command import main

if __name__ == "__main__":
    main(sys.argv[1:])
