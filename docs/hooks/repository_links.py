"""MkDocs hook: links from a page to a repository file outside docs/.

Design documents and decision records link to files of the repository that are not pages of the
site, e.g. ``[raw](../../benchmarks/results/peers-2026-11-25T1810.json)`` from
``docs/decisions/``. MkDocs cannot resolve such a link and warns, which fails ``--strict``; its
``validation.links.not_found`` setting could silence them, but only together with every broken
link between pages. This hook rewrites, before MkDocs sees them, exactly the links whose target
lies outside ``docs/`` and exists in the repository:

- with ``repo_url`` set in mkdocs.yml, into a link to the file in the repository browser,
  ``<repo_url>/blob/<extra.repository_branch, default main>/<path>``;
- without it, into text naming the file: ``raw (`benchmarks/results/....json`)``; the file's
  path alone, in code font, when the label already names the file (its path or its name); the
  label alone when it names the file's directory.

A link outside ``docs/`` to a file that does not exist is left alone, so MkDocs still reports it.
Links inside code (fenced blocks and inline code spans) are not touched.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

#: A fenced code block (``` or ~~~, any indentation): kept as it is.
_FENCE = re.compile(r"^( *)(`{3,}|~{3,})[^\n]*\n.*?^\1\2[ \t]*$", re.M | re.S)
#: An inline code span: a link that starts inside one is kept as it is.
_CODE_SPAN = re.compile(r"(`+)[^`\n]*?\1")
#: An inline link or image: ``[label](target)`` or ``[label](target "title")``; the label may wrap
#: onto the next lines, never across a blank line.
_LINK = re.compile(r"(!?)\[((?:[^\]\n]|\n(?!\s*\n))*)\]\(\s*<?([^)\s>]+)>?(\s+\"[^\"]*\")?\s*\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Rewrite the page's links to existing repository files outside ``docs/``."""
    docs_dir = Path(config["docs_dir"]).resolve()
    repository = Path(config["config_file_path"]).resolve().parent
    page_dir = (docs_dir / page.file.src_path).parent
    repo_url = (config.get("repo_url") or "").rstrip("/")
    branch = (config.get("extra") or {}).get("repository_branch", "main")

    def rewrite(match: re.Match[str], spans: list[tuple[int, int]]) -> str:
        if any(start < match.start() < end for start, end in spans):
            return match.group(0)
        bang, label, target, title = match.groups()
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^/|^#", target):
            return match.group(0)  # a URL, an absolute path or an anchor of this page
        path, _, anchor = target.partition("#")
        resolved = Path(posixpath.normpath(str(page_dir / path)))
        if resolved.is_relative_to(docs_dir) or not resolved.is_relative_to(repository):
            return match.group(0)
        if not resolved.exists():
            return match.group(0)  # broken: let MkDocs report it
        relative = resolved.relative_to(repository).as_posix()
        if repo_url:
            url = f"{repo_url}/blob/{branch}/{relative}" + (f"#{anchor}" if anchor else "")
            return f"{bang}[{label}]({url}{title or ''})"
        plain = label.strip().strip("`")
        if not plain or plain in (relative, posixpath.basename(relative)):
            return f"`{relative}`"
        if relative.startswith(plain.rstrip("/") + "/"):
            return label  # the label names the directory, e.g. `benchmarks/results/`
        return f"{label} (`{relative}`)"

    def rewrite_text(text: str) -> str:
        spans = [span.span() for span in _CODE_SPAN.finditer(text)]
        return _LINK.sub(lambda match: rewrite(match, spans), text)

    parts: list[str] = []
    position = 0
    for fence in _FENCE.finditer(markdown):
        parts.append(rewrite_text(markdown[position : fence.start()]))
        parts.append(fence.group(0))
        position = fence.end()
    parts.append(rewrite_text(markdown[position:]))
    return "".join(parts)
