"""MkDocs hook: reST leftovers of the docstrings in the API reference pages (``docs/api/``).

The docstrings of waltz-py use Google-style sections (rendered by mkdocstrings) and, inside their
prose, Sphinx roles such as ``:class:`~waltz.local.cluster.LocalCluster``` and the literal-block
marker ``::``. Markdown renders a role as ``:class:`` followed by code; this hook keeps the code
alone (the last component of a ``~``-prefixed name, as Sphinx shows it) and turns a paragraph's
final ``::`` into ``:``.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const|type):<code>(~?)([^<]*)</code>")
_LITERAL_MARKER = re.compile(r"::</p>")


def _code(match: re.Match[str]) -> str:
    tilde, name = match.groups()
    if tilde:
        name = name.rsplit(".", 1)[-1]
    return f"<code>{name}</code>"


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """Clean the roles and ``::`` markers of an API reference page."""
    if not page.file.src_uri.startswith("api/"):
        return html
    return _LITERAL_MARKER.sub(":</p>", _ROLE.sub(_code, html))
