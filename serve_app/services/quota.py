"""Stored-memory quotas per tenant: a write that would go past the quota is refused with 429.

The count is the tenant's memories in the keyword index (one row per memory, long-term store).
Appended turns not memorized yet are not counted, so a tenant can overshoot by what arrives
within one memorizer sweep; nothing already accepted is ever dropped to honour the quota.
"""

from __future__ import annotations

from serve_app.errors import QuotaExceeded
from serve_app.services.dependencies import Dependencies


async def check_memory_quota(deps: Dependencies, tenant: str, adding: int) -> None:
    """Raise QuotaExceeded when the tenant already stores its quota of memories or more (0 = no quota)."""
    quota = deps.settings.quota_overrides.get(tenant, deps.settings.quota_memories)
    if quota <= 0 or adding <= 0:
        return
    used = await deps.stores.keywords.count(tenant)
    if used + adding > quota:
        raise QuotaExceeded(quota, used)
