"""The import rules of the package layout (docs/design/overview.md, "Packages and their imports").

The rules are checked on the import graph of ``waltz`` and ``waltz_examples`` as ``grimp`` builds
it from the source: every ``import`` statement, those inside functions and those under ``if
TYPE_CHECKING:`` included. A type-only import never runs, but it ties two modules as much as any
other for a reader: a circle made of them is still a circle, and a layer may not name what it may
not import.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import grimp
import pytest

#: What every layer may import besides itself: the error hierarchy under ``WaltzError``, a module
#: that imports nothing of ours.
ERRORS = "waltz.errors"
#: The modes of the files the project writes, a module that imports nothing of ours either: the
#: storage node and the archive's format write with it.
FILE_MODES = "waltz.private_files"

#: The modules of the top level that the client may use besides the wire protocol and the
#: metadata layer: errors, configuration loading, a histogram of its metrics and the hooks of
#: its traces.
CLIENT_MAY_ALSO_IMPORT = frozenset({ERRORS, "waltz.config", "waltz.batched_histogram", "waltz.tracing"})


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("waltz", "waltz_examples", exclude_type_checking_imports=False, cache_dir=None)


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _imports_from(graph: grimp.ImportGraph, package: str) -> Iterator[tuple[str, str]]:
    """Every (importer, imported) pair of a direct import from ``package`` to outside it."""
    for importer in sorted(m for m in graph.modules if _within(m, package)):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            if not _within(imported, package):
                yield importer, imported


def _describe(pairs: Iterable[tuple[str, str]]) -> str:
    return "\n".join(f"  {importer} -> {imported}" for importer, imported in pairs)


def test_the_file_modes_import_nothing_of_ours(graph: grimp.ImportGraph) -> None:
    bad = [(a, b) for a, b in _imports_from(graph, FILE_MODES)]
    assert not bad, f"{FILE_MODES} must stand alone; it imports:\n{_describe(bad)}"


def test_the_wire_protocol_imports_nothing_of_ours_but_the_errors(graph: grimp.ImportGraph) -> None:
    bad = [(a, b) for a, b in _imports_from(graph, "waltz.protocol") if b != ERRORS]
    assert not bad, f"waltz.protocol must stand alone; it imports:\n{_describe(bad)}"


def test_the_metadata_layer_imports_only_the_protocol(graph: grimp.ImportGraph) -> None:
    bad = [
        (a, b)
        for a, b in _imports_from(graph, "waltz.metadata")
        if b not in (ERRORS, FILE_MODES) and not _within(b, "waltz.protocol")
    ]
    assert not bad, (
        "waltz.metadata may import only waltz.protocol, the errors and the file modes; it imports:\n"
        f"{_describe(bad)}"
    )


def test_the_client_imports_only_the_protocol_and_the_metadata_layer(graph: grimp.ImportGraph) -> None:
    bad = [
        (a, b)
        for a, b in _imports_from(graph, "waltz.client")
        if b not in CLIENT_MAY_ALSO_IMPORT
        and not _within(b, "waltz.protocol")
        and not _within(b, "waltz.metadata")
    ]
    assert not bad, (
        "waltz.client may import only waltz.protocol, waltz.metadata and "
        f"{sorted(CLIENT_MAY_ALSO_IMPORT)}; it imports:\n{_describe(bad)}"
    )


def test_the_tracing_hooks_import_only_the_protocol_and_the_errors(graph: grimp.ImportGraph) -> None:
    """The client and the server both load ``waltz.tracing``: it stands below them."""
    bad = [
        (a, b)
        for a, b in _imports_from(graph, "waltz.tracing")
        if b != ERRORS and not _within(b, "waltz.protocol")
    ]
    assert not bad, (
        f"waltz.tracing may import only waltz.protocol and the errors; it imports:\n{_describe(bad)}"
    )


def test_the_committed_reads_import_only_the_admin_port_the_metadata_and_the_storage_format(
    graph: grimp.ImportGraph,
) -> None:
    """Spark and the archiver read the log through ``waltz.committed``: it stands below both."""
    allowed = ("waltz.protocol", "waltz.metadata", "waltz.admin.storage_nodes", "waltz.services.storage")
    bad = [
        (a, b)
        for a, b in _imports_from(graph, "waltz.committed")
        if b != ERRORS and not any(_within(b, package) for package in allowed)
    ]
    assert not bad, (
        f"waltz.committed may import only {', '.join(allowed)} and the errors; it imports:\n{_describe(bad)}"
    )


#: The modules of the archive a server reads it with: its files and their checks, nothing of the
#: archiver's (ZooKeeper, the admin ports, the committed reads).
ARCHIVE_FORMAT = (
    "waltz.archive.errors",
    "waltz.archive.location",
    "waltz.archive.layout",
    "waltz.archive.manifests",
    "waltz.archive.columns",
    "waltz.archive.chunks",
    "waltz.archive.reader",
)


def test_the_archives_format_imports_only_the_protocol_and_the_errors(graph: grimp.ImportGraph) -> None:
    """The servers will read the archive: its format stands as low as the protocol."""
    bad = [
        (module, imported)
        for module in ARCHIVE_FORMAT
        for imported in sorted(graph.find_modules_directly_imported_by(module))
        if imported not in (ERRORS, FILE_MODES)
        and imported not in ARCHIVE_FORMAT
        and not _within(imported, "waltz.protocol")
    ]
    assert not bad, f"the archive's format may import only waltz.protocol and the errors:\n{_describe(bad)}"


@pytest.mark.parametrize(
    "forbidden", ["waltz.spark", "waltz.cli", "waltz.local", "waltz.client", "waltz.services"]
)
def test_the_archiver_stands_beside_the_admin_tools(graph: grimp.ImportGraph, forbidden: str) -> None:
    bad = [(a, b) for a, b in _imports_from(graph, "waltz.archive") if _within(b, forbidden)]
    assert not bad, f"waltz.archive must not import {forbidden}:\n{_describe(bad)}"


@pytest.mark.parametrize(
    "forbidden", ["waltz.services.server", "waltz.metadata", "waltz.local", "waltz.admin"]
)
def test_the_storage_node_never_imports_the_server_the_metadata_or_the_harness(
    graph: grimp.ImportGraph, forbidden: str
) -> None:
    bad = [(a, b) for a, b in _imports_from(graph, "waltz.services.storage") if _within(b, forbidden)]
    assert not bad, f"the storage node must not import {forbidden}:\n{_describe(bad)}"


@pytest.mark.parametrize(
    "above", ["waltz.cli", "waltz.local", "waltz.admin", "waltz.client", "waltz.testing", "waltz_examples"]
)
def test_the_nodes_import_nothing_above_them(graph: grimp.ImportGraph, above: str) -> None:
    bad = [(a, b) for a, b in _imports_from(graph, "waltz.services") if _within(b, above)]
    assert not bad, f"nothing under waltz.services may import {above}:\n{_describe(bad)}"


def test_the_library_imports_no_example(graph: grimp.ImportGraph) -> None:
    """The tools find an application by its module's name (``--app``): the library never imports one."""
    bad = [(a, b) for a, b in _imports_from(graph, "waltz") if _within(b, "waltz_examples")]
    assert not bad, f"no module of waltz may import waltz_examples:\n{_describe(bad)}"


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The import circles: strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(root: str) -> None:
        # Iterative, so that a long chain of imports cannot reach the recursion limit.
        work: list[tuple[str, Iterator[str]]] = []

        def enter(module: str) -> None:
            index[module] = low[module] = len(index)
            stack.append(module)
            on_stack.add(module)
            work.append((module, iter(sorted(graph.find_modules_directly_imported_by(module)))))

        enter(root)
        while work:
            module, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    enter(target)
                elif target in on_stack:
                    low[module] = min(low[module], index[target])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == index[module]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_there_are_no_import_circles(graph: grimp.ImportGraph) -> None:
    cycles = _cycles(graph)
    assert not cycles, "import circles:\n" + "\n".join("  " + " <-> ".join(c) for c in cycles)


def test_the_circle_check_finds_a_circle() -> None:
    graph = grimp.ImportGraph()
    for module in ("a", "a.b", "a.c", "a.d"):
        graph.add_module(module)
    graph.add_import(importer="a.b", imported="a.c")
    graph.add_import(importer="a.c", imported="a.b")
    graph.add_import(importer="a.c", imported="a.d")
    assert _cycles(graph) == [["a.b", "a.c"]]


#: What the operator console may import besides itself: the admin tools, the metadata layer and the
#: wire protocol (which the admin tools' values carry), and the shared top-level modules.
CONSOLE_MAY_ALSO_IMPORT = frozenset({ERRORS, "waltz.config", "waltz"})


def test_the_console_imports_only_the_admin_tools_and_the_metadata_layer(graph: grimp.ImportGraph) -> None:
    bad = [
        (a, b)
        for a, b in _imports_from(graph, "waltz.console")
        if b not in CONSOLE_MAY_ALSO_IMPORT
        and not _within(b, "waltz.admin")
        and not _within(b, "waltz.metadata")
        and not _within(b, "waltz.protocol")
    ]
    assert not bad, (
        "waltz.console may import only waltz.admin, waltz.metadata, waltz.protocol and "
        f"{sorted(CONSOLE_MAY_ALSO_IMPORT)}; it imports:\n{_describe(bad)}"
    )


def test_only_the_cli_imports_the_console(graph: grimp.ImportGraph) -> None:
    importers = {
        importer
        for module in graph.modules
        if _within(module, "waltz.console")
        for importer in graph.find_modules_that_directly_import(module)
        if not _within(importer, "waltz.console")
    }
    bad = sorted(i for i in importers if not _within(i, "waltz.cli"))
    assert not bad, f"only waltz.cli may import waltz.console; imported by: {', '.join(bad)}"
