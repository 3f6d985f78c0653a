"""``python -m waltz``: the ``waltz`` command line, for hosts where only the interpreter is on PATH."""

from waltz.cli.entry import main

if __name__ == "__main__":
    main()
