"""Health's rules stay small (issue: health's checks as small functions, one per finding): every function
in ``relay.health`` is at most 60 lines, so a finding's judgement can be read, and tested, on its own.

A check that grows past it is split by finding or by situation, its inputs gathered once before it
judges (``relay.health.views``), rather than this limit raised.
"""

from __future__ import annotations

import ast
from pathlib import Path

from relay.config import PROJECT_ROOT

HEALTH = PROJECT_ROOT / "include" / "relay" / "health"
MAX_LINES = 60


def function_sizes(path: Path) -> dict[str, int]:
    """Lines of every function and method of a module (decorators to last line), by qualified name."""
    sizes: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    start = min([child.lineno] + [d.lineno for d in child.decorator_list])
                    sizes[name] = (child.end_lineno or child.lineno) - start + 1
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text()), "")
    return sizes


def test_every_health_function_is_at_most_60_lines() -> None:
    modules = sorted(HEALTH.glob("*.py"))
    assert modules, f"no module under {HEALTH}"
    too_long = {
        f"{path.name}:{name}": size
        for path in modules
        for name, size in function_sizes(path).items()
        if size > MAX_LINES
    }
    assert too_long == {}, f"split these by finding or situation (at most {MAX_LINES} lines each)"


def test_the_size_rule_sees_a_long_function(tmp_path: Path) -> None:
    """The scan counts nested and decorated functions, so the rule cannot pass by missing one."""
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_LINES))
    source = f"import functools\n\nclass C:\n    @functools.cache\n    def m(self):\n{body}\n"
    source += f"\ndef outer():\n    def inner():\n{body}\n    return inner\n"
    path = tmp_path / "long.py"
    path.write_text(source)
    sizes = function_sizes(path)
    assert sizes["C.m"] == MAX_LINES + 2 and sizes["outer.inner"] == MAX_LINES + 1
    assert sizes["outer"] == MAX_LINES + 3
