"""The MkDocs hooks of the documentation site (docs/hooks/, named in mkdocs.yml)."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parents[2]


def load_hook(name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", ROOT / "docs" / "hooks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def page(src_path: str) -> Any:
    return types.SimpleNamespace(file=types.SimpleNamespace(src_path=src_path, src_uri=src_path))


def rewrite(markdown: str, src_path: str = "decisions/0001-x.md", repo_url: str | None = None) -> str:
    config = {
        "docs_dir": str(ROOT / "docs"),
        "config_file_path": str(ROOT / "mkdocs.yml"),
        "repo_url": repo_url,
        "extra": {},
    }
    result: str = load_hook("repository_links").on_page_markdown(markdown, page(src_path), config, None)
    return result


def test_links_to_repository_files_become_their_path() -> None:
    assert rewrite("see [raw](../../benchmarks/RESULTS.md).") == "see raw (`benchmarks/RESULTS.md`)."
    assert rewrite("[`RESULTS.md`](../../benchmarks/RESULTS.md)") == "`benchmarks/RESULTS.md`"
    assert rewrite("[`benchmarks/results/`](../../benchmarks/results/README.md)") == "`benchmarks/results/`"
    assert rewrite("[script](../benchmarks/sql_apply.py)", src_path="benchmarks.md") == (
        "script (`benchmarks/sql_apply.py`)"
    )
    # A label that wraps onto the next line, as a paragraph's text does.
    assert (
        rewrite("the [raw\nresults](../../benchmarks/RESULTS.md)")
        == "the raw\nresults (`benchmarks/RESULTS.md`)"
    )
    # Never across a blank line: two paragraphs, no link in the first.
    two = "[not a label\n\nof it](../../benchmarks/RESULTS.md)"
    assert rewrite(two) == two


def test_repo_url_makes_them_links() -> None:
    assert rewrite("[raw](../../benchmarks/RESULTS.md#machine)", repo_url="https://example.org/r/") == (
        "[raw](https://example.org/r/blob/main/benchmarks/RESULTS.md#machine)"
    )


def test_other_links_are_left_to_mkdocs() -> None:
    for markdown in (
        "[a page](../sql.md)",  # inside docs/
        "[missing](../../benchmarks/no-such-file.md)",  # broken: MkDocs reports it
        "[outside](../../../elsewhere.md)",  # outside the repository
        "[web](https://example.org/x.md)",
        "[anchor](#section)",
        "`[raw](../../benchmarks/RESULTS.md)`",  # inline code
        "```md\n[raw](../../benchmarks/RESULTS.md)\n```\n",  # a fenced block
    ):
        assert rewrite(markdown) == markdown, markdown


def test_sphinx_roles_become_code_on_api_pages() -> None:
    hook = load_hook("sphinx_roles")
    html = "<p>See :class:<code>~waltz.local.cluster.LocalCluster</code> and :func:<code>x.y</code>::</p>"
    assert hook.on_page_content(html, page("api/x.md"), None, None) == (
        "<p>See <code>LocalCluster</code> and <code>x.y</code>:</p>"
    )
    assert hook.on_page_content(html, page("sql.md"), None, None) == html
