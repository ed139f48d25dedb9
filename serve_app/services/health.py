"""Status of each backing store, for `/healthz` and readiness probes."""

from __future__ import annotations

from serve_app import schemas
from serve_app.services.dependencies import Dependencies


async def check(deps: Dependencies) -> schemas.Health:
    backends = await deps.stores.health()
    return schemas.Health(status="ok" if all(v == "ok" for v in backends.values()) else "degraded", backends=backends)
