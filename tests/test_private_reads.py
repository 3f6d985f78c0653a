"""No module of ``waltz`` reads another object's private attributes across modules (CONTRIBUTING.md,
"How we write code": give the other side an API).

An attribute read ``x._name`` (``x`` not ``self`` or ``cls``) is allowed where ``_name`` is defined
in the same module (a class reading its own instances, a module's own helper). The one exception is
the SQL framework's direct path, which reads SQLAlchemy's internals on purpose
(``waltz/jdbc_style/direct.py``: each use names the versions its tests pass with), and
SQLAlchemy's ``Row._mapping``, which is public API under an underscore.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import support

PACKAGE = Path(__file__).resolve().parents[1] / "waltz"

#: ``(module, attribute)`` reads allowed across modules, with why.
ALLOWED = {
    # SQLAlchemy's public Row API (its underscore avoids clashes with column names).
    ("waltz/jdbc_style/skips.py", "_mapping"),
    # The direct statement path: SQLAlchemy internals, pinned by waltz/jdbc_style/direct.py's tests.
    ("waltz/jdbc_style/direct.py", "_echo"),
    ("waltz/jdbc_style/direct.py", "_cached_result_processor"),
    ("waltz/jdbc_style/direct.py", "_result_columns"),
    ("waltz/jdbc_style/direct.py", "_bind_processors"),
    ("waltz/jdbc_style/direct.py", "_handle_dbapi_exception"),
    # The standard library's public exit without cleanup: the stop watchdog's last resort.
    ("waltz/services/runtime.py", "_exit"),
}


def private_reads(source: str) -> list[tuple[int, str, str]]:
    """``(line, attribute, expression)`` of each read of a private attribute defined elsewhere."""
    tree = support.parse_python(source)
    defined: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            defined.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
        elif isinstance(node, ast.alias):
            defined.add(node.asname or node.name.split(".")[-1])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("_"):
            defined.add(node.value)  # __slots__ entries
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        if node.attr.startswith("__") and node.attr.endswith("__"):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        if node.attr not in defined:
            found.append((node.lineno, node.attr, ast.unparse(node)))
    return found


def test_no_module_reads_another_objects_private_attributes() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        module = str(path.relative_to(PACKAGE.parent))
        for line, attribute, expression in private_reads(path.read_text(encoding="utf-8")):
            if (module, attribute) not in ALLOWED:
                offenders.append(f"{module}:{line}: {expression}")
    assert not offenders, "reads of private attributes defined in other modules:\n" + "\n".join(offenders)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f(p):\n    return p._queue\n", ["_queue"]),
        (
            "class A:\n    def __init__(self):\n        self._q = 1\n"
            "    def f(self, o):\n        return o._q\n",
            [],
        ),
        ("def f(self):\n    return self._anything\n", []),
        ("def f(p):\n    return p.__class__\n", []),
    ],
)
def test_the_check_finds_a_read_across_modules_and_only_that(source: str, expected: list[str]) -> None:
    assert [attribute for _, attribute, _ in private_reads(source)] == expected
