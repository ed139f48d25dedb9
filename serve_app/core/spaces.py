"""Memory spaces: memory that a tenant's agents share and none of them owns. Pure: no I/O.

A space's memories and facts live in the same stores as a user's, under the owner id
`space:<name>`. The colon is outside `ID_PATTERN`, so no user id can ever name a space: a route that
takes a user id cannot reach a space's rows, and every store query of a space is scoped to an owner
id that a grant let in (`owners_for`), never filtered afterwards.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from serve_app.core.ids import MAX_ID_LENGTH

Role = Literal["read", "write", "admin"]
ROLES: tuple[Role, ...] = ("read", "write", "admin")
SPACE_PREFIX = "space:"
MAX_SPACE_LENGTH = MAX_ID_LENGTH - len(SPACE_PREFIX)
"""A space's owner id is stored where a user id is, so the name leaves room for the prefix."""
SPACE_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9._@-]{{0,{MAX_SPACE_LENGTH - 1}}}$"
MAX_SPACES_PER_REQUEST = 8


def space_owner(space: str) -> str:
    """The owner id a space's rows are stored under."""
    return SPACE_PREFIX + space


def space_of(owner: str) -> str | None:
    """The space an owner id names, None for a user."""
    return owner[len(SPACE_PREFIX) :] if owner.startswith(SPACE_PREFIX) else None


def allows(role: Role | None, need: Role) -> bool:
    """Whether a role covers what an operation needs: admin > write > read."""
    return role is not None and ROLES.index(role) >= ROLES.index(need)


def effective_role(tenant_admin: bool, granted: Role | None) -> Role | None:
    """A key with the tenant's admin role administers every space of its tenant; others have their grant."""
    return "admin" if tenant_admin else granted


def denied(spaces: Sequence[str], roles: dict[str, Role], need: Role) -> list[str]:
    """The named spaces the caller may not `need` (unknown spaces included: a key without a grant
    cannot tell a space that does not exist from one it may not see)."""
    return [s for s in spaces if not allows(roles.get(s), need)]


def unique(spaces: Iterable[str]) -> list[str]:
    """The spaces in the order named, each once."""
    return list(dict.fromkeys(spaces))
