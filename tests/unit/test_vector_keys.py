"""The one id length and the owner-scoped vector keys: pure rules, no store."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from serve_app import schemas
from serve_app.core.ids import ID_PATTERN, MAX_ID_LENGTH, InvalidIdError, validate_id, vector_key
from serve_app.core.records import MemoryRow, unstorable


def _row(**fields: str) -> MemoryRow:
    values = {"id": "m1", "tenant_id": "t", "user_id": "u", "session_id": "", "role": "memory", "kind": "memory"} | fields
    return MemoryRow(seq=0, text="x", created_at_ms=0, vector=[], **values)


def test_the_longest_id_the_api_accepts_fits_the_vector_store():
    longest = "a" * MAX_ID_LENGTH
    assert validate_id(longest) == longest and re.fullmatch(ID_PATTERN, longest)
    with pytest.raises(InvalidIdError):
        validate_id(longest + "a")
    assert schemas.MemoryIn(text="x", id=longest).id == longest
    with pytest.raises(ValidationError):
        schemas.MemoryIn(text="x", id=longest + "a")
    assert unstorable(_row(id=longest, tenant_id=longest, user_id=longest, session_id=longest)) is None


@pytest.mark.parametrize("field", ["id", "tenant_id", "user_id", "session_id"])
def test_a_longer_id_than_any_store_holds_is_named(field):
    too_long = MAX_ID_LENGTH + 1
    assert unstorable(_row(**{field: "a" * too_long})) == f"{field} of {too_long} bytes (at most {MAX_ID_LENGTH})"


def test_vector_keys_are_scoped_to_the_owner_and_fixed_in_length():
    keys = {vector_key("t", "alice", "note-1"), vector_key("t2", "alice", "note-1"), vector_key("t", "bob", "note-1")}
    assert len(keys) == 3
    assert vector_key("t", "alice", "note-1") == vector_key("t", "alice", "note-1")
    # The fields are separated: shifting a character from one to the next is another key.
    assert vector_key("t", "ab", "c") != vector_key("t", "a", "bc")
    assert {len(vector_key("t" * n, "u", "m" * n)) for n in (1, MAX_ID_LENGTH)} == {len(vector_key("", "", ""))}
