"""Passwords out of connection strings before they are logged: URLs keep their user, host and path,
libpq key/value DSNs their other keys. Pure: no I/O."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

MASK = "***"
# `password=` in a URL's query (libpq and redis-py read it there) or a libpq key/value DSN, quoted or not.
_PASSWORD_PARAM = re.compile(r"(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^&\s]*)")


def mask_password(value: str) -> str:
    """`value` with the password of its userinfo and any `password=` parameter replaced by `***`."""
    masked = _PASSWORD_PARAM.sub(lambda m: m.group(1) + MASK, value)
    try:
        netloc = urlsplit(masked).netloc
    except ValueError:  # not a URL a client would parse either: the parameter rule still applied
        return masked
    userinfo, at, host = netloc.rpartition("@")
    user, colon, _password = userinfo.partition(":")
    if not (at and colon):
        return masked
    start = masked.index(netloc)
    return f"{masked[:start]}{user}:{MASK}@{host}{masked[start + len(netloc) :]}"
