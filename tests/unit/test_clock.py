"""A stored turn's `created_at` read back as a time: what facts keep as when the user said them."""

from datetime import UTC, datetime, timedelta, timezone

from serve_app.core.clock import iso_to_datetime, iso_to_ms


def test_a_turns_time_is_read_as_an_aware_datetime_and_a_naive_one_as_utc():
    assert iso_to_datetime("2024-05-20T09:00:00+00:00") == datetime(2024, 5, 20, 9, tzinfo=UTC)
    assert iso_to_datetime("2024-05-20T09:00:00") == datetime(2024, 5, 20, 9, tzinfo=UTC)
    oslo = iso_to_datetime("2024-05-20T11:00:00+02:00")
    assert oslo == datetime(2024, 5, 20, 9, tzinfo=UTC) and oslo.utcoffset() == timedelta(hours=2)
    assert oslo.tzinfo == timezone(timedelta(hours=2))
    assert iso_to_ms("2024-05-20T09:00:00") == int(datetime(2024, 5, 20, 9, tzinfo=UTC).timestamp() * 1000)


def test_no_time_or_a_malformed_one_is_none():
    assert iso_to_datetime(None) is None and iso_to_datetime("") is None
    assert iso_to_datetime("last Tuesday") is None
