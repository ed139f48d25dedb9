"""Stored-memory quotas per tenant: a write that would go past the quota is refused with 429.

The count is the tenant's memories in the keyword index (one row per memory, long-term store).
Appended turns not memorized yet are not counted, so a tenant can overshoot by what arrives
within one memorizer sweep; nothing already accepted is ever dropped to honour the quota.
"""

from __future__ import annotations

from serve_app.stores.keyword_index import KeywordIndex
from serve_app.stores.rate_limit import RateLimited

QUOTA_RETRY_AFTER_S = 3600  # space comes back only when the tenant deletes something


class QuotaExceeded(RateLimited):
    def __init__(self, quota: int, used: int):
        super().__init__(
            f"quota of {quota} stored memories reached ({used} stored); delete memories or sessions, or ask for a larger quota",
            QUOTA_RETRY_AFTER_S,
        )


async def check_memory_quota(keywords: KeywordIndex, tenant: str, quota: int, adding: int) -> None:
    """Raise QuotaExceeded when the tenant already stores `quota` memories or more (0 = no quota)."""
    if quota <= 0 or adding <= 0:
        return
    used = await keywords.count(tenant)
    if used + adding > quota:
        raise QuotaExceeded(quota, used)
