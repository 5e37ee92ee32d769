"""The module-size rule of ./dev lint (tools/module_sizes.py)."""

from __future__ import annotations

from pathlib import Path

from tools.module_sizes import MAX_LINES, problems


def module(root: Path, name: str, lines: int) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x = 1\n" * lines)


def test_module_sizes_a_module_over_the_limit_is_named_with_its_lines(tmp_path):
    """451 lines fail, naming the module, its lines and the fix; 450 pass."""
    module(tmp_path, "later_django/big.py", MAX_LINES + 1)
    module(tmp_path, "later_django/db/fits.py", MAX_LINES)
    (problem,) = problems(tmp_path)
    assert problem.startswith("later_django/big.py: 451 lines, over the limit of 450")
    assert "split it by what it does" in problem


def test_module_sizes_migrations_are_exempt(tmp_path):
    module(tmp_path, "later_django/migrations/0001_initial.py", 2000)
    assert problems(tmp_path) == []
