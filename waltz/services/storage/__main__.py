"""``python -m waltz.services.storage``: the same as ``waltz storage start``."""

import sys

from waltz.services.storage.command import main

if __name__ == "__main__":
    main(sys.argv[1:])
