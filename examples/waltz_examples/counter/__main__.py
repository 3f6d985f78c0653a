"""``python -m waltz_examples.counter``: see :mod:`waltz_examples.counter.cli`."""

from waltz_examples.counter.cli import main

if __name__ == "__main__":
    main()
