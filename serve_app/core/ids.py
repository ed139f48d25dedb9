"""Identifier rules and the deterministic ids derived from them.

Ids end up inside Redis keys and Milvus filter expressions, so they are validated once at the boundary.
"""

from __future__ import annotations

import hashlib
import re

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$"
_ID_RE = re.compile(ID_PATTERN)


class InvalidIdError(ValueError):
    """An id that does not follow ID_PATTERN."""


def validate_id(value: str, what: str = "id") -> str:
    if not isinstance(value, str) or not _ID_RE.fullmatch(value):
        raise InvalidIdError(
            f"{what} must be 1-128 characters of letters, digits, '.', '_', '@' or '-', starting with a letter or digit"
        )
    return value


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()[:32]


def turn_memory_id(tenant_id: str, user_id: str, session_id: str, role: str, content: str) -> str:
    """Memory id of a session turn: a fingerprint of who said what, where.

    Not the turn's seq: a session's log expires after its TTL and the next append to the same id
    starts again at seq 1, so a seq-based id would overwrite the memories of the expired session (or,
    for another user reusing the id, take them over). With the user and the text in it, a retried
    memorization upserts the same row, a conversation resent after expiry finds its memories already
    there, and a new conversation under an old session id adds beside the old one."""
    return "t" + _digest(tenant_id, user_id, session_id, role, " ".join(content.split()))


def direct_memory_id(tenant_id: str, user_id: str, text: str) -> str:
    """Vector id of a memory added directly: the same text added twice is stored once."""
    return "m" + _digest(tenant_id, user_id, text)
