"""The architecture stays visible: no package file over 300 lines, no function over 60 (issue 14).
A file or function that is clearer whole goes in ALLOWED with the reason, where a reviewer sees it."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "psring"
MAX_FILE_LINES, MAX_FUNCTION_LINES = 300, 60
ALLOWED: dict[str, str] = {}  # "path[:function]" -> why it is clearer whole


def oversized(root: Path) -> list[str]:
    """``path (N lines)`` and ``path:function (N lines)`` for everything over the limits under ``root``."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        src = path.read_text()
        if src.count("\n") > MAX_FILE_LINES and rel not in ALLOWED:
            out.append(f"{rel} ({src.count(chr(10))} lines)")
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES and f"{rel}:{node.name}" not in ALLOWED:
                    out.append(f"{rel}:{node.name} ({n} lines, line {node.lineno})")
    return out


def test_checker_sees_a_long_function_and_a_long_file(tmp_path):
    pkg = tmp_path / "psring"
    pkg.mkdir()
    (pkg / "long.py").write_text("def f():\n" + "    x = 1\n" * 70 + "\n" * 240)
    assert oversized(pkg) == ["psring/long.py (311 lines)", "psring/long.py:f (71 lines, line 1)"]


def test_no_package_file_or_function_over_the_limits():
    too_big = oversized(PACKAGE)
    assert not too_big, "split these (or add them to ALLOWED with the reason):\n  " + "\n  ".join(too_big)
