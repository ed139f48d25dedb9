"""Path parameters shared by the routers: ids end up in store keys and filters, so each is bounded
and matches `ID_PATTERN`."""

from __future__ import annotations

from fastapi import Path

from serve_app.core.ids import ID_PATTERN, MAX_ID_LENGTH

SessionId = Path(pattern=ID_PATTERN, max_length=MAX_ID_LENGTH, description="Session id.")
UserId = Path(pattern=ID_PATTERN, max_length=MAX_ID_LENGTH, description="User id.")
FactKey = Path(pattern=ID_PATTERN, max_length=MAX_ID_LENGTH, description="Fact key.")
MemoryId = Path(pattern=ID_PATTERN, max_length=MAX_ID_LENGTH, description="Memory id.")
