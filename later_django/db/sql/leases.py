"""The one lease primitive: the rule every lease statement follows.

Three tables hold leases: ``later_lease`` (a server's lead of a
cluster-wide duty), ``later_partition`` (a server's hold on a partition of a
topic) and ``later_log_consumer`` (a group member's hold on a partition of
the retained log). Each row is a key, a holder, an epoch and an expiry, and
every statement on them is made here, by the same rule (docs/explanation/design.md,
"Leases"):

- take: a holder takes a lease that is free (never taken, released, or
  expired on the database's clock) or its own. A new holder gets the next
  epoch; a holder taking a lease it holds live keeps its epoch, unless the
  table says every take is a new tenure (a member name can outlive its
  process). Another live holder: no row.
- renew and release are fenced by the epoch: a holder that lost the lease
  changes nothing. A holder of many leases of one table (a server's
  partitions) renews or releases them all by its id, which no other holder
  ever has.
- a release expires the lease at once and keeps the row, so epochs only
  grow, and what the row carries (a committed offset) stays for the next
  holder.
"""

from __future__ import annotations

from dataclasses import dataclass

from later_django.db.sql import compose


@dataclass(frozen=True, slots=True)
class LeaseTable:
    """Where a table keeps a lease's parts."""

    table: str
    key: tuple[str, ...]
    holder: str
    expires: str
    # Every take is a new epoch, even the live holder's own (else it keeps it).
    take_is_new_tenure: bool = False
    # A release also clears the holder (the table shows who holds what).
    release_clears_holder: bool = False


def take_sql(lease: LeaseTable, *, source: str, takeover: str = "", returning: str = "") -> str:
    """Take or keep ``lease``: insert the row from ``source`` (the column
    list, then a VALUES or a SELECT of the key, the holder, epoch 1, the
    expiry and the table's other columns) or update it by the rule.
    ``takeover`` adds a condition under which a live lease is taken anyway
    (" OR ..."). Returns the epoch, then ``returning``'s columns."""
    if lease.take_is_new_tenure:
        step = "1"
    else:
        step = compose(
            "CASE WHEN {t}.{h} = excluded.{h} AND {t}.{e} >= {now} THEN 0 ELSE 1 END",
            t=lease.table,
            h=lease.holder,
            e=lease.expires,
        )
    return compose(
        """INSERT INTO {t} {source}
ON CONFLICT ({key}) DO UPDATE SET
    epoch = {t}.epoch + {step}, {h} = excluded.{h}, {e} = excluded.{e}
WHERE {t}.{h} IS NULL OR {t}.{h} = excluded.{h} OR {t}.{e} < {now}{takeover}
RETURNING epoch{returning}""",
        t=lease.table,
        source=source,
        key=", ".join(lease.key),
        step=step,
        h=lease.holder,
        e=lease.expires,
        takeover=takeover,
        returning=returning,
    )


def renew_sql(lease: LeaseTable, *, where: str | None = None, returning: str = "") -> str:
    """Extend ``lease`` to the database's now plus a duration (the first
    parameter), fenced by its key and epoch (the next ones), or by ``where``."""
    return compose(
        "UPDATE {t} SET {e} = {now} + %s WHERE {where}{returning}",
        t=lease.table,
        e=lease.expires,
        where=fence(lease) if where is None else where,
        returning=returning and " RETURNING " + returning,
    )


def release_sql(lease: LeaseTable, *, where: str | None = None) -> str:
    """Let ``lease`` go now, fenced by its key and epoch (the parameters), or
    by ``where``: expired at once, the row kept."""
    return compose(
        "UPDATE {t} SET {e} = 0{cleared} WHERE {where}",
        t=lease.table,
        e=lease.expires,
        cleared=f", {lease.holder} = NULL" if lease.release_clears_holder else "",
        where=fence(lease) if where is None else where,
    )


def fence(lease: LeaseTable) -> str:
    """The fence of a write under ``lease``: its row is still at the epoch
    its holder took (whether or not the lease has run out)."""
    return " AND ".join(f"{column} = %s" for column in (*lease.key, "epoch"))
