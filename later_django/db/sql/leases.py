"""SQL of ``later_lease``: named leases (namespace, name, owner, epoch, expiry)."""

from __future__ import annotations

from typing import Final

# A new holder (no row, or the last one expired) gets the next epoch; the
# live holder renews and keeps its epoch; anyone else gets no row.
LEASE_ACQUIRE_SQL: Final = """
INSERT INTO later_lease (namespace, name, owner, epoch, expires_ms)
VALUES (%s, %s, %s, 1, {now} + %s)
ON CONFLICT (namespace, name) DO UPDATE SET
    epoch = later_lease.epoch + CASE
        WHEN later_lease.owner = excluded.owner AND later_lease.expires_ms >= {now}
        THEN 0 ELSE 1 END,
    owner = excluded.owner,
    expires_ms = excluded.expires_ms
WHERE later_lease.owner = excluded.owner OR later_lease.expires_ms < {now}
RETURNING epoch
"""

# Released leases expire at once; the row stays, so epochs keep growing.
LEASE_RELEASE_SQL: Final = """
UPDATE later_lease SET expires_ms = 0
WHERE namespace = %s AND name = %s AND owner = %s AND epoch = %s
"""
