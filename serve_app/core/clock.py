"""Instants as the stores keep them: UTC epoch milliseconds. Pure."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from functools import lru_cache

DAY_MS = 86_400_000


def now_ms() -> int:
    return int(time.time() * 1000)


def ms_to_datetime(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def iso_day(ms: int) -> str:
    """The UTC date of an instant, ISO: memory lines carry one per memory, and memories share days."""
    return _iso_day(ms // DAY_MS)


@lru_cache(maxsize=8192)
def _iso_day(day: int) -> str:
    return ms_to_datetime(day * DAY_MS).date().isoformat()


def datetime_to_ms(when: datetime) -> int:
    """A naive datetime is taken as UTC, as the API documents."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def iso_to_datetime(text: str | None) -> datetime | None:
    """An ISO 8601 instant (a stored turn's `created_at`) as an aware datetime (naive taken as UTC);
    None when absent or malformed."""
    try:
        when = datetime.fromisoformat(text) if text else None
    except ValueError:
        return None
    return when.replace(tzinfo=UTC) if when is not None and when.tzinfo is None else when


def iso_to_ms(text: str | None) -> int:
    """Milliseconds of an ISO 8601 instant (a stored turn's `created_at`); 0 when absent or malformed."""
    when = iso_to_datetime(text)
    return datetime_to_ms(when) if when is not None else 0
