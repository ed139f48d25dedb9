"""Identifier rules and the deterministic ids derived from them.

Ids end up inside Redis keys, PostgreSQL rows and Milvus fields and filter expressions, so they are
validated once at the boundary, against the one length every store's schema is made to hold.
"""

from __future__ import annotations

import hashlib
import re

MAX_ID_LENGTH = 128
"""The longest id the API accepts; every store field that holds an id is made this wide."""
ID_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9._@-]{{0,{MAX_ID_LENGTH - 1}}}$"
_ID_RE = re.compile(ID_PATTERN)
VECTOR_KEYS = 2
"""How Milvus keys memories: 1 by the memory id alone (one key space for every tenant and user, so
one owner's "note-1" replaced another's), 2 by `vector_key`. PostgreSQL records, per memory, the
scheme its vector was written under (`services.index_repair.move_vectors` brings older ones up)."""


class InvalidIdError(ValueError):
    """An id that does not follow ID_PATTERN."""


def validate_id(value: str, what: str = "id") -> str:
    if not isinstance(value, str) or not _ID_RE.fullmatch(value):
        raise InvalidIdError(
            f"{what} must be 1-{MAX_ID_LENGTH} characters of letters, digits, '.', '_', '@' or '-',"
            " starting with a letter or digit"
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


def summary_memory_id(tenant_id: str, user_id: str, session_id: str, session_created_ms: int, block: int) -> str:
    """Memory id of a block of a session's summary (core/session_summaries.py): by the session's
    creation time too, so a conversation under a session id used again after its log expired adds
    its summaries beside the old one's."""
    return "s" + _digest(tenant_id, user_id, session_id, str(session_created_ms), str(block))


def direct_memory_id(tenant_id: str, user_id: str, text: str) -> str:
    """Vector id of a memory added directly: the same text added twice is stored once."""
    return "m" + _digest(tenant_id, user_id, text)


def imported_memory_id(tenant_id: str, user_id: str, prefix: str, old_id: str) -> str:
    """Memory id, under its new owner, of a memory an import copies whose id cannot be made again
    from what the archive holds (a passage of a turn whose log expired, a summary block): its old
    id's digest with the owner's, the same on every import."""
    return prefix + _digest(tenant_id, user_id, "imported", old_id)


def renamed_session_id(session_id: str, user_id: str) -> str:
    """The id an imported session takes in a tenant where another user holds its own: the same on
    every import of it into this user, so a second import finds the first one's."""
    return f"{session_id[: MAX_ID_LENGTH - 9]}.{_digest(user_id, session_id)[:8]}"


def vector_key(tenant_id: str, owner: str, memory_id: str) -> str:
    """The Milvus primary key of a memory: memory ids are unique per owner only, and Milvus has one
    key space per collection. Fixed length, whatever the ids' lengths. The owner is a user id today;
    an owner of another kind (a shared space) would name itself so that no user id can equal it."""
    return "k" + _digest(tenant_id, owner, memory_id)


def promoted_memory_id(tenant_id: str, space_owner: str, user_id: str, memory_id: str) -> str:
    """Id of a memory's copy promoted into a space: promoting it again finds the same copy."""
    return "p" + _digest(tenant_id, space_owner, user_id, memory_id)


def pseudonym(tenant_id: str, user_id: str) -> str:
    """What a forgotten user's id becomes in the provenance of copies kept in spaces: the same for
    every copy of one user (a team can still tell that two came from one person), and not the id."""
    return "forgotten-" + hashlib.sha256(f"memserve forgotten\x1f{tenant_id}\x1f{user_id}".encode()).hexdigest()[:16]
