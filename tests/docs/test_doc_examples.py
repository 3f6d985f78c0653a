"""Every ```python block of README.md and docs/**/*.md runs, so the examples cannot rot.

The design documents (docs/design/) and decision records (docs/decisions/) have no examples to
run and are not searched. Blocks are found and run with pytest-examples: each block is one test,
named ``<file>:<line of its fence>``, run as the module ``__main__`` in a temporary working
directory of its own, with pytest's assertion rewriting; a traceback points into the Markdown file.

A block may be preceded (on the line before its fence, blank lines aside) by one HTML comment,
invisible on the rendered page, that says how it runs (docs/development.md, "Code examples"):

- ``<!-- not-run: REASON -->``: the block is deliberately partial (a fragment of a file that
  only a tool runs, a skeleton); it is not run, and REASON must say why.
- ``<!-- needs: cluster -->``: a fresh local cluster runs while the block does;
  ``WALTZ_ZOOKEEPER_CONNECT_STRING`` and ``WALTZ_CLUSTER_ROOT`` name it (the variables ``waltz up``
  prints), so ``WaltzClientConfig()`` connects to it.
- ``<!-- needs: zookeeper -->``: the block starts ZooKeeper itself (``LocalCluster``); it is
  skipped where ZooKeeper cannot run (failed under CI), like the suite's other ZooKeeper tests.
- ``<!-- needs: spark -->``: the block uses PySpark (the ``spark`` extra); skipped without it
  (failed under CI). Needs combine: ``<!-- needs: cluster, spark -->``.

Functions named ``test_*`` that a block defines (an example of a test using the pytest plugin)
are called after the block with the fixtures their parameters name.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import support
from pytest_examples import CodeExample, EvalExample, find_examples

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parents[2]
#: Pages whose examples do not run: written by the design and decision authors, without examples.
EXCLUDED_DIRS = (ROOT / "docs" / "design", ROOT / "docs" / "decisions")
NEEDS = frozenset({"cluster", "zookeeper", "spark"})
_MARKER = re.compile(r"^<!--\s*(not-run|needs)\s*:(.*?)-->$")


@dataclass(frozen=True)
class DocExample:
    """One ```python block and the marker before it."""

    example: CodeExample
    not_run: str | None  # the reason, "" when the marker gives none; None: the block runs
    needs: frozenset[str]

    @property
    def location(self) -> str:
        return f"{self.example.path.relative_to(ROOT)}:{self.example.start_line}"


def markdown_files() -> list[Path]:
    """README.md and the pages under docs/, less the excluded directories, in a stable order."""
    pages = sorted(
        path
        for path in (ROOT / "docs").rglob("*.md")
        if not any(path.is_relative_to(directory) for directory in EXCLUDED_DIRS)
    )
    return [ROOT / "README.md", *pages]


def doc_examples() -> list[DocExample]:
    """Every ```python (or ```py) block of :func:`markdown_files`, with its marker."""
    found = []
    for path in markdown_files():
        lines = path.read_text("utf-8").splitlines()
        for example in find_examples(path):
            if example.prefix.split()[0] not in ("python", "py"):
                continue
            marker = _marker_before(lines, example.start_line)
            not_run, needs = None, frozenset[str]()
            if marker is not None:
                kind, value = marker
                if kind == "not-run":
                    not_run = value
                else:
                    needs = frozenset(word for word in re.split(r"[\s,]+", value) if word)
            found.append(DocExample(example, not_run, needs))
    return found


def _marker_before(lines: list[str], fence_line: int) -> tuple[str, str] | None:
    """The ``not-run`` / ``needs`` comment on the nearest non-blank line above the fence (1-based)."""
    index = fence_line - 2
    while index >= 0 and not lines[index].strip():
        index -= 1
    if index < 0:
        return None
    match = _MARKER.match(lines[index].strip())
    return (match.group(1), match.group(2).strip()) if match else None


EXAMPLES = doc_examples()


def test_examples_found() -> None:
    """The search finds the examples (a change of the Markdown or of the finder cannot hide them)."""
    files = {example.example.path.name for example in EXAMPLES}
    assert {"README.md", "getting-started.md", "sql.md"} <= files, files
    assert len(EXAMPLES) >= 8, [example.location for example in EXAMPLES]


@pytest.fixture
def isolated_main(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Run in a fresh working directory; give ``__main__`` (which the example replaces) back."""
    monkeypatch.chdir(tmp_path)
    main = sys.modules["__main__"]
    try:
        yield
    finally:
        sys.modules["__main__"] = main


@pytest.mark.parametrize("doc", EXAMPLES, ids=[example.location for example in EXAMPLES])
@pytest.mark.usefixtures("isolated_main")
def test_doc_example(doc: DocExample, eval_example: EvalExample, request: pytest.FixtureRequest) -> None:
    if doc.not_run is not None:
        assert doc.not_run, f"{doc.location}: <!-- not-run: ... --> must give the reason"
        pytest.skip(f"not run: {doc.not_run}")
    unknown = doc.needs - NEEDS
    assert not unknown, f"{doc.location}: unknown needs {sorted(unknown)}; known: {sorted(NEEDS)}"
    if "spark" in doc.needs:
        missing = [name for name in ("pyspark", "pyarrow") if importlib.util.find_spec(name) is None]
        if missing:
            support.unavailable(f"{' and '.join(missing)} not installed (the spark extra)")
    if "zookeeper" in doc.needs:
        request.getfixturevalue("zookeeper")  # skips (fails under CI) when ZooKeeper cannot run
    if "cluster" in doc.needs:
        request.getfixturevalue("waltz_cluster")
    module = eval_example.run(doc.example)
    for name, function in module.items():
        if name.startswith("test_") and inspect.isfunction(function):
            parameters = inspect.signature(function).parameters
            function(**{parameter: request.getfixturevalue(parameter) for parameter in parameters})
