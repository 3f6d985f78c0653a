"""Finding an application by its module's name, as the ``--app MODULE`` option of the commands does.

Source: docs/design/overview.md "Packages and their imports" (the tools find an application by
name; nothing in ``waltz`` imports one). ``waltz rebuild``, ``waltz snapshot``, ``waltz demo``,
``waltz perf smallbank`` and ``waltz chaos`` take ``--app MODULE``; the object they need is a
module attribute (``VIEWS``, ``SMALLBANK``) in ``MODULE.<submodule>`` or in ``MODULE`` itself.

A command run from an application's directory finds its local package, as ``python -m`` would:
the working directory is put first on ``sys.path`` and on ``PYTHONPATH`` (for the processes the
command starts: Spark's workers, the instances of ``waltz perf``).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from waltz.errors import ConfigurationError

__all__ = ["find_app_object", "working_directory_importable"]


def working_directory_importable() -> str:
    """Put the working directory first on ``sys.path`` and on ``PYTHONPATH`` (once); return it."""
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if here not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([here, *paths])
    return here


def find_app_object(module: str, submodule: str, attribute: str, kind: type[Any], what: str) -> Any:
    """The ``attribute`` of ``<module>.<submodule>``, else of ``<module>``, that is a ``kind``.

    Args:
        module: the application's module name, e.g. ``waltz_examples.ledger``.
        submodule: where the attribute usually is, e.g. ``views``.
        attribute: its name, e.g. ``VIEWS``.
        kind: the class it must be an instance of.
        what: what it is, for the error (e.g. ``"a waltz.spark.views.AppViews"``).

    Raises:
        ConfigurationError: no such module (the working directory was searched too), or neither
            module defines the attribute as a ``kind``. An import error inside the application's
            own code is raised as it is.
    """
    here = working_directory_importable()
    found_any = False
    for candidate in (f"{module}.{submodule}", module):
        try:
            loaded = importlib.import_module(candidate)
        except ModuleNotFoundError as exc:
            if exc.name is not None and candidate.startswith(exc.name):
                continue  # this candidate does not exist; the application's own imports raise
            raise
        found_any = True
        value = getattr(loaded, attribute, None)
        if isinstance(value, kind):
            return value
    if not found_any:
        raise ConfigurationError(
            f"no module named {module!r} (searched the installed packages and the working directory "
            f"{here}); run the command from the directory that holds the package, or install it"
        )
    raise ConfigurationError(f"neither {module}.{submodule} nor {module} defines {attribute} ({what})")
