"""``python -m waltz.services.storage``: the same as ``waltz storage start``."""

from waltz.cli.main import main

if __name__ == "__main__":
    main(["storage", "start", *__import__("sys").argv[1:]])
