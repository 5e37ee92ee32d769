"""SQLite's word for the database's clock ({now}). Its own statements stand
beside PostgreSQL's in the modules of their concern (``NAME_SQLITE``)."""

from __future__ import annotations

from typing import Final

# -- clock fragment (see __init__.py) -------------------------------------------
# julianday('now') has millisecond precision and one value per statement
# step; the 3.40 library here lacks unixepoch('subsec').
NOW_SQL: Final = "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"
