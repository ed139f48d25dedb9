"""The time a query asks about, when it names one: "on 7 July, 2023", "in August 2023", "in 2022",
"in June". Recall boosts memories from that window; a query without a date is ranked unchanged."""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

_MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_name) if name}
_MONTHS |= {name.lower(): i for i, name in enumerate(calendar.month_abbr) if name}
_MONTH = r"(?P<month>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_YEAR = r"(?P<year>(?:19|20)\d\d)"
_DAY = r"(?P<day>[0-3]?\d)(?:st|nd|rd|th)?"
_PATTERNS = [
    re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH},?\s+{_YEAR}\b", re.I),  # 7 July, 2023
    re.compile(rf"\b{_MONTH}\s+{_DAY},?\s+{_YEAR}\b", re.I),  # July 7, 2023
    re.compile(rf"\b{_YEAR}-(?P<month_num>[01]\d)-(?P<day>[0-3]\d)\b"),  # 2023-07-07
    re.compile(rf"\b{_MONTH},?\s+{_YEAR}\b", re.I),  # July 2023
    re.compile(rf"\b(?:in|during|since|of)\s+{_MONTH}(?!\s+\d)\b", re.I),  # in June (any year)
    re.compile(rf"\b(?:in|during|since|of)\s+{_YEAR}\b", re.I),  # in 2022
]


@dataclass(frozen=True)
class Timeframe:
    """Half-open UTC window [start, end); `month` alone (no year) matches that month of any year."""

    start: datetime | None = None
    end: datetime | None = None
    month: int | None = None

    def contains(self, when: datetime) -> bool:
        if self.month is not None:
            return when.month == self.month
        assert self.start is not None and self.end is not None
        return self.start <= when < self.end


def _utc(year: int, month: int, day: int) -> datetime:
    return datetime(year, month, day, tzinfo=UTC)


def query_timeframe(query: str) -> Timeframe | None:
    """The first date expression of the query as a window, or None. A day is widened by a day on
    each side (time zones, a conversation that runs past midnight)."""
    for pattern in _PATTERNS:
        match = pattern.search(query)
        if not match:
            continue
        groups = match.groupdict()
        month = int(groups["month_num"]) if groups.get("month_num") else _MONTHS.get((groups.get("month") or "").lower())
        year = int(groups["year"]) if groups.get("year") else None
        try:
            if groups.get("day") and year and month:
                day = _utc(year, month, int(groups["day"]))
                return Timeframe(day - timedelta(days=1), day + timedelta(days=2))
            if year and month:
                start = _utc(year, month, 1)
                return Timeframe(start, _utc(year + (month == 12), month % 12 + 1, 1))
            if month:
                return Timeframe(month=month)
            if year:
                return Timeframe(_utc(year, 1, 1), _utc(year + 1, 1, 1))
        except ValueError:  # "31 February 2023"
            continue
    return None
