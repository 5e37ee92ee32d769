"""The lease rule: what every lease statement follows.

Three tables hold leases: ``later_lease`` (a server's lead of a
cluster-wide duty, sql/servers.py), ``later_partition`` (a server's hold on
a partition of a topic, sql/partitions.py) and ``later_log_consumer`` (a
group member's hold on a partition of the retained log,
sql/retained_log.py). Each row is a key, a holder, an epoch and an expiry,
and every statement on them, written whole in those modules, follows the
same rule (docs/explanation/design.md, "Leases"):

- take: a holder takes a lease that is free (never taken, released, or
  expired on the database's clock) or its own, in one upsert. A new holder
  gets the next epoch; a holder taking a lease it holds live keeps its
  epoch, unless the table says every take is a new tenure (a member name
  can outlive its process). Another live holder: no row.
- renew and release are fenced by the epoch: a holder that lost the lease
  changes nothing. A holder of many leases of one table (a server's
  partitions) renews or releases them all by its id, which no other holder
  ever has.
- a release expires the lease at once and keeps the row, so epochs only
  grow, and what the row carries (a committed offset) stays for the next
  holder.
"""
