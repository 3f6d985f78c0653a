"""The rules docs/asyncio-service.md shows are the wallet example's: the bodies of the page's
``__init__`` and ``run`` methods and its model's columns are the code of
``waltz_examples.wallet.models`` (annotations, docstrings and comments aside)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
import support

from waltz_examples.wallet import models

pytestmark = pytest.mark.docs

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "asyncio-service.md"


def _without_docstrings(node: ast.AST) -> None:
    for child in ast.walk(node):
        body = getattr(child, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            del body[0]


def _members(tree: ast.AST) -> dict[str, str]:
    """``Class.run`` and ``Class.columns`` of the classes a module defines, as comparable dumps."""
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name in ("run", "__init__"):
                _without_docstrings(item)  # the page's signatures have no annotations: bodies only
                found[f"{node.name}.{item.name}"] = "\n".join(ast.dump(statement) for statement in item.body)
        columns = [item for item in node.body if isinstance(item, ast.AnnAssign | ast.Assign)]
        if columns:
            found[f"{node.name}.columns"] = "\n".join(ast.dump(c) for c in columns)
    return found


def test_the_guide_s_rules_are_the_example_s() -> None:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.DOTALL)
    page = [block for block in blocks if "class Withdraw(EntityTransactionContext)" in block]
    assert len(page) == 1, "the page's block of the entities and their rules"
    shown = _members(support.parse_python(page[0]))
    example = _members(support.parse_python(inspect.getsource(models)))
    compared = ["Wallet.columns", "Deposit.__init__", "Deposit.run", "Withdraw.__init__", "Withdraw.run"]
    for name in compared:
        assert shown.get(name) == example.get(name), f"{name} differs between {GUIDE.name} and models.py"
