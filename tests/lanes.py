"""Drive both lanes of the memorizer for one session, one pass each, as the sweep runs them."""

from __future__ import annotations

from serve_app.services.memorizer import MemorizeReport
from serve_app.services.sweep import MemorizerSweep


class BothLanes:
    def __init__(self, sweep: MemorizerSweep):
        self.sweep = sweep

    async def memorize(self, tenant: str, session: str) -> MemorizeReport:
        """The embedding pass, then the LLM pass; the report of the LLM pass with the embedding counts."""
        embedded = await self.sweep.schedule(tenant, session)
        if embedded.cursor < 0:
            return embedded
        report = await self.sweep.schedule_llm(tenant, session)
        report.embedded = embedded.embedded
        report.cursor = embedded.cursor if report.cursor >= 0 else report.cursor
        return report
