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

# Modules over the limit that are being split on branches of their own, with
# the lines each had when listed here: a listed module may not grow, and its
# entry goes once its split is merged (a listed module at or under the limit,
# or gone, fails the rule until its entry is removed).
BEING_SPLIT: dict[str, int] = {
    "later_django/db/jobs.py": 651,  # into stores
    "later_django/db/postgresql.py": 508,  # into stores
}


def line_count(path: Path) -> int:
    """Lines of ``path`` as ``wc -l`` counts them (a last line without a
    newline counts too)."""
    return len(path.read_text(encoding="utf-8").splitlines())


def problems(root: Path = ROOT, being_split: dict[str, int] = BEING_SPLIT) -> list[str]:
    """One sentence per module under ``root`` that breaks the rule, in path
    order; ``being_split`` are the listed exceptions."""
    found = []
    sizes = {
        path.relative_to(root).as_posix(): line_count(path)
        for path in sorted((root / PACKAGE).rglob("*.py"))
    }
    for name, lines in sizes.items():
        if name.startswith(EXEMPT) or lines <= MAX_LINES:
            continue
        listed = being_split.get(name)
        if listed is None:
            found.append(
                f"{name}: {lines} lines, over the limit of {MAX_LINES}: split it by what "
                "it does, one module per concern (a package when they share a noun), and "
                "keep the names others import importable where they were"
            )
        elif lines > listed:
            found.append(
                f"{name}: {lines} lines, more than the {listed} it had when listed as being "
                f"split (tools/module_sizes.py BEING_SPLIT): it may not grow; put what was "
                "added in a module of its own"
            )
    for name in being_split:
        if sizes.get(name, 0) <= MAX_LINES:
            now = "is gone" if name not in sizes else f"has {sizes[name]} lines"
            found.append(
                f"{name} {now}, no longer over {MAX_LINES}: remove its entry from "
                "BEING_SPLIT in tools/module_sizes.py"
            )
    return found


def main() -> int:
    found = problems()
    for problem in found:
        print(problem)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
