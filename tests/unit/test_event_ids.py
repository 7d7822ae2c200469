"""The journal's bulk event ids: random version-4 UUIDs that behave like uuid.uuid4()'s."""

from __future__ import annotations

import uuid

from shared import journal


def test_bulk_event_ids_are_distinct_version_4_uuids_like_uuid4s() -> None:
    ids = journal.new_event_ids(2000)
    assert len(set(ids)) == 2000
    for u in ids:
        assert isinstance(u, uuid.UUID)
        assert (u.version, u.variant) == (4, uuid.RFC_4122)
        assert uuid.UUID(str(u)) == u and hash(uuid.UUID(str(u))) == hash(u)
        assert u.is_safe is uuid.SafeUUID.unknown
    # every random bit varies (not, say, a counter or a fixed half)
    assert all(any((a.int ^ b.int) >> bit & 1 for a, b in zip(ids, ids[1:], strict=False))
               for bit in range(128) if bit not in (76, 77, 78, 79, 62, 63))
    assert journal.new_event_ids(0) == []
