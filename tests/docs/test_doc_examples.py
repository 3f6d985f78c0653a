"""Every ```python block of README.md and docs/**/*.md runs, so that the examples cannot rot.

The design documents (docs/design/) and decision records (docs/decisions/) have no examples to
run and are not searched. Each block is one test, named ``<file>:<line of its fence>``. It runs
as a module of its own, in a temporary working directory of its own, compiled with pytest's
assertion rewriting and with the Markdown file's name and line numbers, so that a failure's
traceback shows the lines of the page.

A block may be preceded (on the line before its fence, blank lines aside) by one HTML comment,
invisible on the rendered page, that says how it runs (docs/development.md, "Code examples"):

- ``<!-- not-run: REASON -->``: the block is deliberately partial (a fragment of a file that only
  a tool runs); it is not run, and REASON must say why.
- ``<!-- needs: cluster -->``: a fresh local cluster runs while the block does;
  ``WALTZ_ZOOKEEPER_CONNECT_STRING`` and ``WALTZ_CLUSTER_ROOT`` name it (the variables ``waltz up``
  prints), so that ``WaltzClientConfig()`` connects to it.
- ``<!-- needs: zookeeper -->``: the block starts ZooKeeper itself (``LocalCluster``); skipped
  where ZooKeeper cannot run (failed under CI), like the suite's other ZooKeeper tests.
- ``<!-- needs: spark -->``: the block uses PySpark (the ``spark`` extra); skipped without it
  (failed under CI). Needs combine: ``<!-- needs: cluster, spark -->``.

Functions named ``test_*`` that a block defines (an example of a test for the pytest plugin) are
called after the block, with the fixtures their parameters name.

The blocks are found by their fences (CommonMark's rules, as far as these pages use them):
an opening line of three or more backticks or tildes, indented or not (inside a list item), and
a closing line of the same character, at least as long, with nothing after it.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
import textwrap
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import support
from _pytest.assertion.rewrite import rewrite_asserts

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parents[2]
#: Directories whose pages are not searched: the design documents and decision records.
EXCLUDED_DIRS = (ROOT / "docs" / "design", ROOT / "docs" / "decisions")
#: What a ``<!-- needs: ... -->`` marker may name.
NEEDS = frozenset({"cluster", "zookeeper", "spark"})
#: Info strings of the blocks that run.
PYTHON = frozenset({"python", "py"})

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*?)\s*$")
_MARKER = re.compile(r"^<!--\s*(?P<kind>not-run|needs)\s*:(?P<value>.*?)-->$")


@dataclass(frozen=True)
class DocExample:
    """One ```python block of a page, and its marker."""

    path: Path
    line: int  # 1-based line of the opening fence
    source: str  # dedented; its first line is the page's line ``line + 1``
    not_run: str | None  # the reason given, "" when none is; None: the block runs
    needs: frozenset[str]

    @property
    def location(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def markdown_files() -> list[Path]:
    """README.md and the pages under docs/, less the excluded directories."""
    pages = sorted(
        path
        for path in (ROOT / "docs").rglob("*.md")
        if not any(path.is_relative_to(directory) for directory in EXCLUDED_DIRS)
    )
    return [ROOT / "README.md", *pages]


def code_blocks(lines: list[str]) -> Iterator[tuple[int, str, list[str]]]:
    """(0-based index of the opening fence, info string, body lines) of every fenced block."""
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None or (opening["fence"][0] == "`" and "`" in opening["info"]):
            index += 1
            continue
        fence = opening["fence"]
        closing = re.compile(rf"^ *{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        end = index + 1
        while end < len(lines) and not closing.match(lines[end]):
            end += 1
        yield index, opening["info"], lines[index + 1 : end]
        index = end + 1


def marker_before(lines: list[str], fence_index: int) -> re.Match[str] | None:
    """The ``not-run`` / ``needs`` comment on the nearest non-blank line above a fence."""
    index = fence_index - 1
    while index >= 0 and not lines[index].strip():
        index -= 1
    return _MARKER.match(lines[index].strip()) if index >= 0 else None


def doc_examples() -> list[DocExample]:
    """Every ```python block of :func:`markdown_files`, in page order."""
    found = []
    for path in markdown_files():
        lines = path.read_text("utf-8").splitlines()
        for index, info, body in code_blocks(lines):
            if (info.split() or [""])[0] not in PYTHON:
                continue
            marker = marker_before(lines, index)
            not_run = marker["value"].strip() if marker and marker["kind"] == "not-run" else None
            needs = frozenset[str]()
            if marker and marker["kind"] == "needs":
                needs = frozenset(word for word in re.split(r"[\s,]+", marker["value"]) if word)
            source = textwrap.dedent("\n".join(body)) + "\n"
            found.append(DocExample(path, index + 1, source, not_run, needs))
    return found


EXAMPLES = doc_examples()


def run_example(example: DocExample, config: pytest.Config) -> dict[str, object]:
    """Execute the block as a fresh module; return its namespace.

    Line numbers are the page's (the source is shifted down by the fence's line), and the file
    name is the page's path, so tracebacks show the page.
    """
    source = "\n" * example.line + example.source
    tree = support.parse_python(source, filename=str(example.path))
    rewrite_asserts(tree, source.encode(), str(example.path), config)
    code = compile(tree, str(example.path), "exec", dont_inherit=True)
    stem = re.sub(r"\W", "_", example.path.stem)
    name = f"docs_example_{stem}_{example.line}"
    module = types.ModuleType(name)
    module.__file__ = str(example.path)
    sys.modules[name] = module  # classes (SQLAlchemy models, dataclasses) look their module up
    try:
        exec(code, module.__dict__)
    finally:
        del sys.modules[name]
    return module.__dict__


def test_examples_found() -> None:
    """The search finds the examples: a change of the pages or of the search cannot hide them."""
    files = {example.path.name for example in EXAMPLES}
    assert {"README.md", "getting-started.md", "local-cluster.md", "sql.md", "spark.md"} <= files, files
    assert all(example.source.strip() for example in EXAMPLES)


@pytest.mark.parametrize("example", EXAMPLES, ids=[example.location for example in EXAMPLES])
def test_doc_example(
    example: DocExample, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if example.not_run is not None:
        assert example.not_run, f"{example.location}: <!-- not-run: ... --> must say why"
        pytest.skip(f"not run: {example.not_run}")
    unknown = example.needs - NEEDS
    assert not unknown, f"{example.location}: unknown needs {sorted(unknown)}; known: {sorted(NEEDS)}"
    if "spark" in example.needs:
        missing = [name for name in ("pyspark", "pyarrow") if importlib.util.find_spec(name) is None]
        if missing:
            support.unavailable(f"{' and '.join(missing)} not installed (the spark extra)")
    if "zookeeper" in example.needs:
        request.getfixturevalue("zookeeper")  # skips (fails under CI) where ZooKeeper cannot run
    if "cluster" in example.needs:
        request.getfixturevalue("waltz_cluster")
    monkeypatch.chdir(tmp_path)
    namespace = run_example(example, request.config)
    for name, function in namespace.items():
        if name.startswith("test_") and inspect.isfunction(function):
            parameters = inspect.signature(function).parameters
            function(**{parameter: request.getfixturevalue(parameter) for parameter in parameters})


def test_fences_and_markers() -> None:
    """The block search itself: indented fences, tildes, longer closing fences, markers."""
    page = textwrap.dedent(
        """\
        <!-- not-run: a fragment -->
        ```python
        a = 1
        ```
        1. item

           <!-- needs: cluster, spark -->

           ```py title="x"
           b = 2
           ````
        ~~~markdown
        ```python
        not a block of its own
        ```
        ~~~
        ```sh
        echo 3
        ```
        """
    ).splitlines()
    blocks = [(index, info, body) for index, info, body in code_blocks(page)]
    assert [(index, info) for index, info, _ in blocks] == [
        (1, "python"),
        (8, 'py title="x"'),
        (11, "markdown"),
        (16, "sh"),
    ]
    assert blocks[1][2] == ["   b = 2"]
    first, second = (marker_before(page, index) for index, _, _ in blocks[:2])
    assert first is not None and (first["kind"], first["value"].strip()) == ("not-run", "a fragment")
    assert second is not None and (second["kind"], second["value"].strip()) == ("needs", "cluster, spark")
    assert marker_before(page, blocks[3][0]) is None
