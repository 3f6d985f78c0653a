"""Sub-command groups of ``waltz`` that are imported only when they run.

``waltz cluster`` imports kazoo, gRPC and the cluster admin; ``waltz db`` alembic and SQLAlchemy;
``waltz disk`` the storage format; ``waltz client`` the client. Importing them all made every
``waltz`` invocation (``--help``,
``waltz perf``, ``waltz up``) pay about a second of imports on a 2-core machine. Their help texts
live here, so that ``waltz --help`` lists them without importing them; each group's module uses
the same text for its own ``--help``.
"""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any, Final

import typer
import typer.core

__all__ = ["HELP", "MARKUP", "SHORT_HELP", "LazyGroup", "first_sentence", "shorten_listings"]

#: How every ``waltz`` command renders its help (``typer.Typer(rich_markup_mode=MARKUP)``): None is
#: Click's own formatter, which joins the hard-wrapped lines of a docstring paragraph, wraps every
#: text to the terminal (at most 78 columns), breaking a word too long for its column rather than
#: cutting it, and puts an option's help under its name when the name is long. Typer's Rich panels
#: cut option names and long words short with "…" at 80 columns, the width of a piped help
#: (docs/decisions/0081-help-in-click-s-own-format.md).
MARKUP: Final = None


def _whole_hyphenated_words() -> None:
    """Make Click's help wrapper keep a hyphenated word on one line.

    Click wraps help with :class:`textwrap.TextWrapper`, which by default may end a line after a
    hyphen: an option or a fault named in a help text came out as ``--in-`` / ``flight`` or
    ``pause-`` / ``server``, which a user cannot copy. Click builds its wrapper afresh for every
    text from its ``_textwrap`` module (Typer bundles that Click as ``typer._click``; older Typers
    use ``click``), so the wrapper there is replaced, once, by one that breaks only at spaces. A
    word longer than its column is still broken rather than cut
    (docs/decisions/0081-help-in-click-s-own-format.md).
    """
    for name in ("typer._click._textwrap", "click._textwrap"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        wrapper = module.TextWrapper
        if getattr(wrapper, "keeps_hyphenated_words", False):
            return

        class WholeWords(wrapper):  # type: ignore[misc,valid-type]
            keeps_hyphenated_words = True

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                kwargs.setdefault("break_on_hyphens", False)
                super().__init__(*args, **kwargs)

        setattr(module, "TextWrapper", WholeWords)  # noqa: B010 (mypy cannot see into the module)
        return


_whole_hyphenated_words()

#: The help of each lazily imported group (its module's ``app`` uses the same text).
HELP = {
    "disk": (
        "Inspect and verify a storage node's files directly, without a running node. "
        "Read-only: no file is ever modified. Byte layouts: docs/format.md."
    ),
    "cluster": (
        "Create, inspect, verify and delete a Waltz cluster in ZooKeeper, and manage its storage "
        "nodes. Every command needs the ZooKeeper connect string and the cluster root: "
        "--zookeeper/--root, WALTZ_ZOOKEEPER_CONNECT_STRING/WALTZ_CLUSTER_ROOT, or "
        "zookeeper.connectString/cluster.root in a --config YAML file. "
        "Exit codes: 0 success, 1 a check failed or a storage node refused, 2 usage, configuration "
        "or connection error. Znodes and rules: docs/zookeeper.md."
    ),
    "client": (
        "Check a cluster as a client sees it: the serializability check (validate), each partition's "
        "high-water mark, and whether every server and storage node answers. Every command needs the "
        "cluster's ZooKeeper connect string and root: --zookeeper/--root, "
        "WALTZ_ZOOKEEPER_CONNECT_STRING/WALTZ_CLUSTER_ROOT, or a client --config YAML file. "
        "Exit codes: 0 success, 1 a check failed, 2 usage, configuration or connection error. "
        "See docs/operations.md."
    ),
    "db": (
        "Create and upgrade the SQL framework's own tables (high-water marks, idempotency keys, "
        "skipped transactions) in an application database, show its high-water marks, and skip a "
        "transaction whose apply keeps failing. Every command needs the database's SQLAlchemy URL: "
        "--url or WALTZ_DB_URL. "
        "Exit codes: 0 success, 1 refused (skip) or not at head (current), 2 usage, URL, driver or "
        "connection error, or framework tables missing. Tables and procedures: docs/sql.md."
    ),
    "snapshot": (
        "Write an application's tables as of one set of high-water marks as Parquet files with a "
        "manifest, show and verify one, and load one into a database that an instance resumes from; "
        "`waltz rebuild --from-snapshot` replays only the log after it. Every command that reads the "
        "application needs --app MODULE, and the database's URL: --url or WALTZ_DB_URL. "
        "Exit codes: 0 success, 1 a snapshot that does not verify, 2 usage, driver or connection error. "
        "See docs/spark.md."
    ),
    "archive": (
        "Archive the log's committed records in Parquet files (a directory or a URL pyarrow opens), "
        "verified against a quorum of replicas; show what the archive holds and how far it lags; verify "
        "it; restore a lost cluster from it. Every command needs the cluster's ZooKeeper connect string "
        "and root: --zookeeper/--root, "
        "WALTZ_ZOOKEEPER_CONNECT_STRING/WALTZ_CLUSTER_ROOT, or a --config YAML file. "
        "Exit codes: 0 success, 1 a partition stopped (run) or a problem found (verify), 2 usage, "
        "configuration or connection error, or an archive that cannot be used. See docs/operations.md."
    ),
}

#: The line each lazily imported group has in the listing of ``waltz --help``.
SHORT_HELP = {
    "disk": "Inspect and verify a storage node's files offline.",
    "cluster": "Create, inspect and verify a cluster; manage its storage nodes.",
    "db": "The SQL framework's tables: create, upgrade, show marks, skip.",
    "client": "Client checks: validate, high-water marks, connectivity.",
    "snapshot": "An application's tables at one set of marks: create, verify, load.",
    "archive": "The log's archive: run the archiver, status, verify, restore.",
}

#: The module whose ``app`` is each lazily imported group.
_MODULES = {
    "disk": "waltz.cli.disk",
    "cluster": "waltz.cli.cluster",
    "db": "waltz.cli.db",
    "client": "waltz.cli.client",
    "snapshot": "waltz.cli.snapshot",
    "archive": "waltz.cli.archive",
}
#: The package extra a group needs beyond waltz-py's own dependencies.
_EXTRAS = {"db": "sql", "snapshot": "sql,spark", "archive": "archive"}


def first_sentence(text: str) -> str:
    """The first sentence of a help text's first paragraph, on one line."""
    paragraph = inspect.cleandoc(text).split("\n\n", 1)[0].replace("\n", " ")
    # A sentence ends at a full stop followed by the end or by a capital ("e.g. 2" goes on).
    match = re.match(r"(.+?[.!?])(?=\s+[A-Z`]|\s*$)", paragraph)
    return match.group(1) if match else paragraph


def shorten_listings(command: Any) -> None:
    """Give every sub-command of ``command`` (at any depth) a one-sentence ``short_help``.

    A group's help lists its sub-commands by their ``short_help``, else by their whole help text,
    which runs to several lines; a short help set by hand is kept. The full text stays in each
    command's own ``--help``.
    """
    for sub in getattr(command, "commands", {}).values():
        if sub.short_help is None and sub.help:
            sub.short_help = first_sentence(sub.help)
        shorten_listings(sub)


class _Unloaded(typer.core.TyperGroup):
    """Stands in for a group in the listing of ``waltz --help`` until the group is used."""


class LazyGroup(typer.core.TyperGroup):
    """The ``waltz`` group: lists every group, imports a lazy one when its name is resolved.

    Click resolves a sub-command through :meth:`resolve_command` both to run it and to complete
    it in a shell, so loading there covers ``waltz db upgrade``, ``waltz db --help`` and
    completion; the top-level help only needs the stand-in's name and help text.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, text in HELP.items():
            if name not in self.commands:
                self.add_command(_Unloaded(name=name, help=text, short_help=SHORT_HELP[name]), name)
        shorten_listings(self)

    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[str | None, Any, list[str]]:
        if args and isinstance(self.commands.get(args[0]), _Unloaded):
            self._load(args[0])
        return super().resolve_command(ctx, args)

    def _load(self, name: str) -> None:
        try:
            module = importlib.import_module(_MODULES[name])
        except ImportError as exc:  # an optional dependency is not installed
            extra = _EXTRAS.get(name)
            hint = f": install it with pip install 'waltz-py[{extra}]'" if extra else ""
            typer.echo(f"error: waltz {name} cannot run here ({exc}){hint}", err=True)
            raise typer.Exit(2) from exc
        command = typer.main.get_command(module.app)
        command.name = name
        command.short_help = SHORT_HELP[name]
        shorten_listings(command)
        self.commands[name] = command
