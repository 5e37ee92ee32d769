"""Every SQL statement's named parameters match what its callers pass.

Read from the source, not from a run: each call that runs a statement of
db/sql/ (``self._run(cursor, module.NAME, name=value, ...)``, ``run``,
``bind``) must pass exactly the statement's parameters, by name; and
every statement is run by some caller."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from collections.abc import Iterator
from pathlib import Path

import later_django.db
import later_django.db.sql
from later_django.db.sql import Statement

DB = Path(later_django.db.__file__).parent


def statements() -> dict[str, Statement]:
    """Every Statement of db/sql/, by its module and name."""
    found = {}
    for info in pkgutil.iter_modules(later_django.db.sql.__path__):
        module = importlib.import_module(f"later_django.db.sql.{info.name}")
        for name, value in vars(module).items():
            if isinstance(value, Statement):
                found[f"{module.__name__}.{name}"] = value
    return found


def module_aliases(tree: ast.Module) -> dict[str, str]:
    """The names a file gives the modules of db/sql/ it imports."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "later_django.db.sql":
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"later_django.db.sql.{alias.name}"
    return aliases


def statement_calls() -> Iterator[tuple[str, str, ast.Call]]:
    """(where, statement, call) for each call in db/ that names a statement,
    directly (``module_sql.NAME``) or through a class attribute a vendor
    sets to one (``self.promote_due_statement``: one pair per statement
    the attribute is set to)."""
    by_attribute = vendor_statements()
    for path in sorted(DB.glob("*.py")):
        tree = ast.parse(path.read_text())
        aliases = module_aliases(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            for arg in node.args:
                where = f"{path.name}:{node.lineno}"
                if not isinstance(arg, ast.Attribute):
                    continue
                if isinstance(arg.value, ast.Name) and arg.value.id in aliases:
                    yield where, f"{aliases[arg.value.id]}.{arg.attr}", node
                else:
                    for name in by_attribute.get(arg.attr, ()):
                        yield where, name, node


def vendor_statements() -> dict[str, set[str]]:
    """The statements each class attribute or vendor field of db/ is set
    to, by its name."""
    found: dict[str, set[str]] = {}
    for path in sorted(DB.glob("*.py")):
        tree = ast.parse(path.read_text())
        aliases = module_aliases(tree)
        for node in ast.walk(tree):
            # A class attribute (promote_due_statement: ... = module_sql.NAME),
            # or a field of a vendor's value (Walks(fail=module_sql.NAME)).
            pairs: list[tuple[str | None, object]] = []
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    target = getattr(item, "target", None)
                    name = target.id if isinstance(target, ast.Name) else None
                    pairs.append((name, getattr(item, "value", None)))
            elif isinstance(node, ast.Call):
                pairs += [(keyword.arg, keyword.value) for keyword in node.keywords]
            for name, value in pairs:
                if (
                    name is not None
                    and isinstance(value, ast.Attribute)
                    and isinstance(value.value, ast.Name)
                    and value.value.id in aliases
                ):
                    statement = f"{aliases[value.value.id]}.{value.attr}"
                    found.setdefault(name, set()).add(statement)
    return found


def test_every_call_passes_exactly_the_parameters_of_its_statement() -> None:
    known = statements()
    wrong = []
    for where, name, call in statement_calls():
        statement = known.get(name)
        if statement is None:
            continue  # a template of the older form, or a fragment
        if isinstance(call.func, ast.Attribute) and call.func.attr == "many":
            continue  # rows of names, checked as they are bound (Statements.many)
        if any(keyword.arg is None for keyword in call.keywords):
            wrong.append(f"{where}: {name} is passed **params; pass each parameter by name")
            continue
        passed = {keyword.arg for keyword in call.keywords}
        if passed != statement.params:
            wrong.append(
                f"{where}: {name} takes {sorted(statement.params)}, passed {sorted(passed)}"
            )
    assert not wrong, "\n".join(wrong)


def test_every_statement_is_run_somewhere() -> None:
    """Each statement is named by code of db/: run with its names checked
    above, or handed on (insert_statement returns INSERT with its names,
    checked as they are bound)."""
    named = {name for _, name, _ in statement_calls()} | statement_references()
    unused = sorted(set(statements()) - named)
    assert not unused, f"statements no caller in db/ runs: {unused}"


def statement_references() -> set[str]:
    """Every ``module_sql.NAME`` written in db/ (outside db/sql/)."""
    found = set()
    for path in sorted(DB.glob("*.py")):
        tree = ast.parse(path.read_text())
        aliases = module_aliases(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
            ):
                found.add(f"{aliases[node.value.id]}.{node.attr}")
    return found


def test_the_check_reads_the_calls_it_is_meant_to() -> None:
    # Guards the test itself: the heartbeat's call is found, with its names.
    calls = {name: call for _, name, call in statement_calls()}
    heartbeat = calls["later_django.db.sql.servers.SERVER_HEARTBEAT"]
    assert {keyword.arg for keyword in heartbeat.keywords} >= {"server_id", "namespace"}


def test_bind_writes_lists_and_inline_numbers_and_names_a_mismatch() -> None:
    from later_django.db.statements import Statements, VendorSql, Walks

    sql = Statements(VendorSql(now="NOW_MS", walks=Walks(fail="", revive="", revive_keyless="")))
    statement = Statement(
        "SELECT %(a)s, {now} WHERE id IN (%(ids)s) AND (id, n) IN (VALUES %(pairs)s) LIMIT %(k)s",
        lists=("ids", "pairs"),
        inline=("k",),
    )
    text, values = sql.bind(statement, a=1, ids=["x", "y"], pairs=[("x", 1)], k=5)
    assert text == (
        "SELECT %s, NOW_MS WHERE id IN (%s, %s) AND (id, n) IN (VALUES (%s, %s)) LIMIT 5"
    )
    assert values == [1, "x", "y", "x", 1]
    # Another size is another text; the same size reuses it with new values.
    assert sql.bind(statement, a=2, ids=["z"], pairs=[("z", 2)], k=5) == (
        "SELECT %s, NOW_MS WHERE id IN (%s) AND (id, n) IN (VALUES (%s, %s)) LIMIT 5",
        [2, "z", "z", 2],
    )
    assert sql.bind(statement, a=3, ids=["p", "q"], pairs=[("p", 3)], k=5) == (
        text,
        [3, "p", "q", "p", 3],
    )
    try:
        sql.bind(statement, a=1, ids=[], pairs=[], kk=5)
    except TypeError as error:
        assert "missing ['k'], unknown ['kk']" in str(error)
    else:
        raise AssertionError("a misspelt parameter was bound")


def test_bind_repeats_the_value_of_a_name_written_twice() -> None:
    from later_django.db.statements import Statements, VendorSql, Walks

    sql = Statements(VendorSql(now="NOW_MS", walks=Walks(fail="", revive="", revive_keyless="")))
    statement = Statement("SELECT 1 WHERE a = %(ns)s AND b = %(x)s AND c = %(ns)s")
    assert sql.bind(statement, ns="n", x=7) == (
        "SELECT 1 WHERE a = %s AND b = %s AND c = %s",
        ["n", 7, "n"],
    )
