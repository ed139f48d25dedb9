"""`hits_out` validates the API's hits in one pass: it must give what building each one gives."""

from __future__ import annotations

from serve_app import schemas
from serve_app.core.clock import ms_to_datetime
from serve_app.core.records import Hit
from serve_app.services.memories import hits_out


def _hit(i: int) -> Hit:
    return Hit(
        id=f"m-{i}", text=f"Yes, last Tuesday! ({i})", score=0.731 - i / 100, session_id="s-1", seq=7 + i, role="user",
        kind="turn", created_at_ms=1_700_000_123_456 + i,
    )  # fmt: skip


def test_hits_out_equals_each_hit_built_alone_in_order():
    hits = [_hit(i) for i in range(5)]
    built = hits_out(hits)
    one_by_one = [
        schemas.SearchHit(
            id=h.id,
            text=h.text,
            score=h.score,
            session_id=h.session_id,
            seq=h.seq,
            created_at=ms_to_datetime(h.created_at_ms),
        )  # fmt: skip
        for h in hits
    ]
    assert built == one_by_one
    assert [b.model_dump_json() for b in built] == [o.model_dump_json() for o in one_by_one]
    assert built[0].created_at.isoformat() == "2023-11-14T22:15:23.456000+00:00"


def test_hits_out_of_nothing_is_empty():
    assert hits_out([]) == []
