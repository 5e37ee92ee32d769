"""SQL on the database as a whole (the dialect's own operations): its clock,
later's tables and triggers, its size, and each vendor's own: PostgreSQL's
wake-up NOTIFY, SQLite's journal, VACUUM and change counter."""

from __future__ import annotations

from typing import Final

from later_django.db.sql import Statement

# The database's clock, for callers that compute times from it in Python.
CLOCK_NOW: Final = Statement("SELECT {now}")

# later's triggers and functions that exist now (what they should be is
# frozen in the migrations: later_django.objects).
INSTALLED_OBJECTS_PG: Final = Statement("""
SELECT tgname FROM pg_trigger WHERE tgrelid = 'later_job'::regclass AND NOT tgisinternal
UNION ALL SELECT proname FROM pg_proc WHERE proname = 'later_complete_many'
""")
INSTALLED_OBJECTS_SQLITE: Final = Statement(
    "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'later_job'"
)

# The tables of the list that do not exist, in its order. to_regclass
# follows the search_path, as the unqualified names of every other
# statement do; NULL is a table it cannot find.
MISSING_TABLES_PG: Final = Statement("""
SELECT t.name FROM unnest(%(tables)s::text[]) WITH ORDINALITY AS t(name, n)
WHERE to_regclass(t.name) IS NULL ORDER BY t.n
""")
# The tables of the list that exist.
TABLES_FOUND_SQLITE: Final = Statement(
    "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN (%(tables)s)",
    lists=("tables",),
)

# The whole database's size on disk.
DATABASE_SIZE_PG: Final = Statement("SELECT pg_database_size(current_database())")
# The database file's size; the write-ahead log beside it is not counted.
DATABASE_SIZE_SQLITE: Final = Statement(
    "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()"
)

# Wake the workers listening on a channel, as the counter triggers do.
NOTIFY_PG: Final = Statement("SELECT pg_notify(%(channel)s, %(payload)s)")

# SQLite's journal mode, and the write-ahead log switched on.
JOURNAL_MODE_SQLITE: Final = Statement("PRAGMA journal_mode")
JOURNAL_WAL_SQLITE: Final = Statement("PRAGMA journal_mode=WAL")
VACUUM_SQLITE: Final = Statement("VACUUM")

# Bumped by every commit of another connection to this file; costs no I/O.
DATA_VERSION_SQLITE: Final = Statement("PRAGMA data_version")
