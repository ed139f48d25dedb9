"""`hit_out` skips pydantic's validation: it must give what validation would."""

from __future__ import annotations

from serve_app import schemas
from serve_app.core.records import Hit
from serve_app.services.memories import hit_out


def test_hit_out_equals_the_validated_model_and_serializes_the_same():
    hit = Hit(
        id="m-1", text="Yes, last Tuesday!", score=0.731, session_id="s-1", seq=7, role="user", kind="turn",
        created_at_ms=1_700_000_123_456,
    )  # fmt: skip
    built = hit_out(hit)
    validated = schemas.SearchHit.model_validate(built.model_dump())
    assert built == validated
    assert built.model_dump_json() == validated.model_dump_json()
    assert built.model_fields_set == set(schemas.SearchHit.model_fields)
    assert built.created_at.isoformat() == "2023-11-14T22:15:23.456000+00:00"
