"""Path parameters shared by the routers: ids end up in store keys and filters, so each is bounded
and matches `ID_PATTERN`."""

from __future__ import annotations

from fastapi import Path

from serve_app.core.ids import ID_PATTERN

SessionId = Path(pattern=ID_PATTERN, max_length=128, description="Session id.")
UserId = Path(pattern=ID_PATTERN, max_length=128, description="User id.")
FactKey = Path(pattern=ID_PATTERN, max_length=128, description="Fact key.")
MemoryId = Path(pattern=ID_PATTERN, max_length=128, description="Memory id.")
