"""``python -m waltz``: the ``waltz`` command line, for hosts where only the interpreter is on PATH."""

from waltz.cli.main import main

if __name__ == "__main__":
    main()
