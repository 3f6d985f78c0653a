"""``python -m examples.counter``: see :mod:`examples.counter.cli`."""

from examples.counter.cli import main

if __name__ == "__main__":
    main()
