"""Every citation of a section of the repository's documents names a section that exists.

Docstrings, comments and pages cite the design as ``docs/design/<file>.md "<section title>"``
(several titles may follow one file). A renamed or removed section would leave such citations
pointing nowhere; this test finds them. Titles compare without backticks, case or line breaks.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Where citations live: the product's code, its tests and benchmarks, and its documents.
SOURCES = ("waltz", "examples", "migrations", "tests", "benchmarks", "docs", "README.md")
SUFFIXES = {".py", ".pyi", ".proto", ".md"}
#: A file path under docs/, then one or more quoted titles separated by commas, "and" or ";".
CITATION = re.compile(r'(docs/[\w/.-]+?\.md)`?\)?,?\s*((?:"[^"]+"(?:\s*(?:,|and|;)\s*(?=")|))+)')
#: Line breaks inside a docstring or comment, with the comment markers of the next line.
LINE_BREAK = re.compile(r"\n\s*(?:#|//)?\s*")


def _normal(title: str) -> str:
    return re.sub(r"\s+", " ", title.replace("`", "")).strip().lower()


@cache
def _sections(path: Path) -> frozenset[str]:
    return frozenset(_normal(m.group(1)) for m in re.finditer(r"^#{1,4} (.+)$", path.read_text(), re.M))


def _files() -> list[Path]:
    found: list[Path] = []
    for name in SOURCES:
        path = ROOT / name
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found += [p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file()]
    return sorted(p for p in found if p != Path(__file__).resolve())  # its own examples are wrong


def _unresolved(text: str) -> list[str]:
    problems = []
    for match in CITATION.finditer(LINE_BREAK.sub(" ", text)):
        target = ROOT / match.group(1)
        titles = re.findall(r'"([^"]+)"', match.group(2))
        if not target.is_file():
            problems.append(f"{match.group(1)} (no such file)")
            continue
        problems += [f'{match.group(1)} "{t}"' for t in titles if _normal(t) not in _sections(target)]
    return problems


def test_every_cited_section_exists() -> None:
    problems = {
        str(path.relative_to(ROOT)): found for path in _files() if (found := _unresolved(path.read_text()))
    }
    assert not problems, "citations of sections that do not exist:\n" + "\n".join(
        f"  {file}: {', '.join(found)}" for file, found in problems.items()
    )


def test_a_citation_of_a_missing_section_or_file_is_found() -> None:
    text = '''"""Design: docs/design/recovery.md "Undecidable high-water mark", "No such
    section"; docs/design/nothing.md "Anything"."""'''
    assert _unresolved(text) == [
        'docs/design/recovery.md "No such section"',
        "docs/design/nothing.md (no such file)",
    ]
