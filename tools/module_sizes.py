"""The module-size rule of ./dev lint: no module of later_django over 450 lines.

A module that long does more than one thing (STYLE.md section 1): split it by
what it does, one module per concern. Migrations are exempt (Django writes
them, and a released one is never edited). Prints each offender with its line
count and exits 1; prints nothing and exits 0 when every module keeps the rule.

    python tools/module_sizes.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "later_django"
MAX_LINES = 450
EXEMPT = ("later_django/migrations/",)


def line_count(path: Path) -> int:
    """Lines of ``path`` as ``wc -l`` counts them (a last line without a
    newline counts too)."""
    return len(path.read_text(encoding="utf-8").splitlines())


def problems(root: Path = ROOT) -> list[str]:
    """One sentence per module under ``root`` that breaks the rule, in path
    order."""
    found = []
    for path in sorted((root / PACKAGE).rglob("*.py")):
        name, lines = path.relative_to(root).as_posix(), line_count(path)
        if not name.startswith(EXEMPT) and lines > MAX_LINES:
            found.append(
                f"{name}: {lines} lines, over the limit of {MAX_LINES}: split it by what "
                "it does, one module per concern (a package when they share a noun), and "
                "keep the names others import importable where they were"
            )
    return found


def main() -> int:
    found = problems()
    for problem in found:
        print(problem)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
