"""Ingress deployment: the HTTP API v1 (FastAPI), with the context builder in-process.

The context builder lives here rather than in its own deployment: each Serve hop costs 5-9 ms on
two cores, and building a context is I/O plus pure budgeting, so another hop would buy nothing.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from datetime import datetime, timezone

import asyncpg
import redis.exceptions
from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from pymilvus.exceptions import MilvusException
from ray import serve
from ray.exceptions import RayTaskError
from ray.serve.handle import DeploymentHandle
from ray.util import metrics
from starlette.types import ASGIApp, Receive, Scope, Send

from serve_app import schemas
from serve_app.core.budget import BudgetError
from serve_app.core.ids import ID_PATTERN, direct_memory_id
from serve_app.core.keywords import memory_keywords
from serve_app.services.compaction import CompactionConflict, SessionNotFound
from serve_app.services.context import build_working_memory, hit_out, ms_to_datetime
from serve_app.services.forget import forget_user
from serve_app.services.memories import delete_memories, save_memories
from serve_app.services.query_encoder import query_embedder
from serve_app.services.quota import check_memory_quota
from serve_app.services.recall import recall
from serve_app.services.stores import Stores
from serve_app.settings import Settings
from serve_app.stores.rate_limit import RateLimited, RateLimiter
from serve_app.stores.session_log import SessionOwnerError
from serve_app.stores.vectors import MemoryRow

logger = logging.getLogger("ray.serve")
UNAVAILABLE = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    MilvusException,
    ConnectionError,
    OSError,
    asyncio.TimeoutError,
)
RETRY_AFTER_S = "2"

app = FastAPI(
    title="agent-memory-serve",
    version="1.0.0",
    description="Working, short-term and long-term memory for LLM agents, on Ray Serve.",
)

SessionId = Path(pattern=ID_PATTERN, max_length=128, description="Session id.")
UserId = Path(pattern=ID_PATTERN, max_length=128, description="User id.")
FactKey = Path(pattern=ID_PATTERN, max_length=128, description="Fact key.")


def _error(status: int, message: str, **extra) -> JSONResponse:
    return JSONResponse(status_code=status, content={"detail": message, **extra})


_bearer = HTTPBearer(auto_error=False, description="API key as a bearer token.")
_api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="API key (alternative header).")


@dataclass(frozen=True)
class Caller:
    """Who is calling: the tenant comes from the API key, never from the request body."""

    tenant: str
    key_digest: str


async def _caller(
    request: Request,
    bearer: HTTPAuthorizationCredentials | None = Depends(_bearer),
    header_key: str | None = Depends(_api_key_header),
) -> Caller:
    keyring = request.app.state.keyring
    if not keyring.enabled:  # the loopback-only local profile
        return Caller(request.app.state.default_tenant, "local")
    found = keyring.tenant_for(bearer.credentials if bearer else header_key)
    if found is None:
        raise HTTPException(401, "missing or invalid API key", headers={"WWW-Authenticate": "Bearer"})
    return Caller(*found)


TenantDep = Depends(_caller)


# Every handler is `async`: Starlette runs a plain `def` handler on a worker thread, which cost
# about 0.5 ms per error response here (a thread started per request on an idle replica).


async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
    logger.warning("backend unavailable: %r", exc)
    response = _error(503, f"a backing store is unavailable ({type(exc).__name__}); retry later")
    response.headers["Retry-After"] = RETRY_AFTER_S
    return response


async def _conflict(request: Request, exc: Exception) -> JSONResponse:
    response = _error(409, str(exc))
    response.headers["Retry-After"] = "1"
    return response


def _echoable(value):
    """`value` in a form that JSON-encodes: lone surrogates escaped, NaN and Infinity as strings."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {_echoable(k): _echoable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_echoable(v) for v in value]
    return value


async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422, whose echo of the bad input stays encodable: a lone surrogate or a NaN sent
    by the client would otherwise turn the 422 into a 500."""
    return _error(422, _echoable(jsonable_encoder(exc.errors())))


app.add_exception_handler(RequestValidationError, _invalid)


async def _not_owner(request: Request, exc: SessionOwnerError) -> JSONResponse:
    return _error(409, "session belongs to another user")


async def _over_budget(request: Request, exc: BudgetError) -> JSONResponse:
    return _error(422, str(exc), token_counts=exc.counts)


async def _no_session(request: Request, exc: SessionNotFound) -> JSONResponse:
    return _error(404, "session not found")


app.add_exception_handler(SessionOwnerError, _not_owner)
app.add_exception_handler(BudgetError, _over_budget)
app.add_exception_handler(SessionNotFound, _no_session)
app.add_exception_handler(CompactionConflict, _conflict)


async def _rate_limited(request: Request, exc: RateLimited) -> JSONResponse:
    response = _error(429, str(exc))
    response.headers["Retry-After"] = str(exc.retry_after_s)
    return response


app.add_exception_handler(RateLimited, _rate_limited)
for _exc in UNAVAILABLE:
    app.add_exception_handler(_exc, _unavailable)


class BodySizeLimit:
    """Oversize bodies are refused (413) from their declared length, before anyone reads them.

    A plain ASGI middleware: Starlette's `@app.middleware("http")` wraps every response in a
    stream and costs about a millisecond per request. Serve logs each request itself (route,
    status, latency, `x-request-id`), so this one only guards."""

    def __init__(self, inner: ASGIApp):
        self.inner = inner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            limit = getattr(scope["app"].state, "max_body_bytes", None) if "app" in scope else None
            declared = dict(scope["headers"]).get(b"content-length", b"")
            if limit and declared.isdigit() and int(declared) > limit:
                response = _error(413, f"request body of {int(declared)} bytes is over the {limit}-byte limit")
                await response(scope, receive, send)
                return
        await self.inner(scope, receive, send)


app.add_middleware(BodySizeLimit)


@serve.deployment(name="Ingress", max_ongoing_requests=64, ray_actor_options={"num_cpus": 0.5})
@serve.ingress(app)
class Ingress:
    async def __init__(self, embedder: DeploymentHandle, memorizer: DeploymentHandle, settings: dict | None = None):
        self.settings = Settings(**(settings or {}))
        self.embedder = embedder
        self.memorizer = memorizer
        self.stores = await Stores.connect(self.settings)
        # Queries embedded here save a Serve hop (~5-9 ms on two cores) on every recall.
        # The first replica on a machine builds the traced encoder in a subprocess (seconds): off the loop.
        self.encoder = (
            await asyncio.to_thread(query_embedder, self.settings.embedding_model, self.settings.embedding_int8)
            if self.settings.query_embedding == "local"
            else None
        )
        self.limiter = RateLimiter(self.stores.log.redis)
        app.state.keyring = self.settings.keyring()
        app.state.default_tenant = self.settings.default_tenant
        app.state.max_body_bytes = self.settings.max_body_bytes
        logger.info("ingress settings: %s", self.settings.redacted())
        self.pokes: set[asyncio.Task] = set()
        self.context_tokens = metrics.Histogram(
            "memserve_context_tokens",
            "Prompt tokens of built contexts.",
            boundaries=[256, 512, 1024, 2048, 4096, 8192, 16384, 32768],
        )
        self.section_tokens = metrics.Histogram(
            "memserve_context_section_tokens",
            "Tokens of each section of built contexts.",
            boundaries=[1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384],
            tag_keys=("section",),
        )
        self.recall_latency = metrics.Histogram(
            "memserve_recall_latency_ms",
            "Hybrid recall (embedding, dense and keyword search, fusion), by caller.",
            boundaries=[2, 5, 10, 15, 20, 30, 50, 100, 250, 1000],
            tag_keys=("path",),
        )

    async def _embed_one(self, text: str) -> list[float]:
        if self.encoder is not None:
            return await self.encoder.encode_one(text)
        return await self.embedder.embed_one.remote(text)

    def _poke(self, tenant: str, session_id: str) -> None:
        async def send() -> None:
            try:
                await self.memorizer.poke.remote(tenant, session_id)
            except Exception as exc:  # the sweep picks the session up from the pending set
                logger.warning("memorizer poke failed: %r", exc)

        task = asyncio.create_task(send())
        self.pokes.add(task)
        task.add_done_callback(self.pokes.discard)

    @app.get("/v1/ping", response_model=schemas.Pong, summary="No-op: the latency floor of this ingress")
    async def ping(self) -> schemas.Pong:
        """Touches no store: the cost of the proxy, the replica and FastAPI alone (bench/load.py's floor)."""
        return schemas.Pong()

    @app.get("/healthz", response_model=schemas.Health, summary="Status of each backing store")
    async def healthz(self) -> JSONResponse:
        backends = await self.stores.health()
        ok = all(v == "ok" for v in backends.values())
        body = schemas.Health(status="ok" if ok else "degraded", backends=backends)
        return JSONResponse(status_code=200 if ok else 503, content=body.model_dump())

    @app.post("/v1/sessions/{session_id}/messages", response_model=schemas.AppendResponse, summary="Append messages")
    async def append(
        self, body: schemas.AppendRequest, session_id: str = SessionId, who: Caller = TenantDep
    ) -> schemas.AppendResponse:
        limit = self.settings.rate_limit_overrides.get(who.tenant, self.settings.rate_limit_messages_per_minute)
        await self.limiter.spend(who.key_digest, len(body.messages), limit)
        await self._check_quota(who.tenant, len(body.messages))
        now = datetime.now(timezone.utc)
        stored = [m.stored(now) for m in body.messages]
        result = await self.stores.log.append(who.tenant, session_id, body.user_id, stored)
        if self.settings.memorizer_poke and not all(result.duplicates):
            self._poke(who.tenant, session_id)
        return schemas.AppendResponse(session_id=session_id, seqs=result.seqs, duplicates=result.duplicates)

    async def _check_quota(self, tenant: str, adding: int) -> None:
        quota = self.settings.quota_overrides.get(tenant, self.settings.quota_memories)
        await check_memory_quota(self.stores.keywords, tenant, quota, adding)

    async def _meta_or_404(self, tenant: str, session_id: str):
        meta = await self.stores.log.meta(tenant, session_id)
        if meta is None:
            raise SessionNotFound(session_id)
        return meta

    @app.get("/v1/sessions/{session_id}", response_model=schemas.SessionInfo, summary="Session state")
    async def session_info(self, session_id: str = SessionId, who: Caller = TenantDep) -> schemas.SessionInfo:
        meta = await self._meta_or_404(who.tenant, session_id)
        return schemas.SessionInfo(
            session_id=session_id,
            user_id=meta.user_id,
            message_count=meta.message_count,
            covers_upto_seq=meta.covers_upto_seq,
            memorized_upto_seq=meta.memorized_upto_seq,
            extracted_upto_seq=meta.extracted_upto_seq,
            summary_version=meta.version,
            summary_degraded=meta.summary_degraded,
            created_at=ms_to_datetime(meta.created_at_ms),
            updated_at=ms_to_datetime(meta.updated_at_ms),
        )

    @app.get("/v1/sessions/{session_id}/messages", response_model=schemas.MessagesPage, summary="Read the log")
    async def messages(
        self,
        who: Caller = TenantDep,
        session_id: str = SessionId,
        after: int = Query(0, ge=0, le=2**53, description="Return messages with seq > after."),
        limit: int = Query(100, ge=1, le=1000),
    ) -> schemas.MessagesPage:
        meta = await self._meta_or_404(who.tenant, session_id)
        rows = await self.stores.log.read(who.tenant, session_id, after=after, limit=limit)
        last = rows[-1]["seq"] if rows else after
        return schemas.MessagesPage(
            session_id=session_id,
            messages=[schemas.StoredMessage(**r) for r in rows],
            summary=meta.summary,
            covers_upto_seq=meta.covers_upto_seq,
            next_after=last if last < meta.message_count else None,
        )

    @app.delete("/v1/sessions/{session_id}", response_model=schemas.Deleted, summary="Delete a session and its vectors")
    async def delete_session(self, session_id: str = SessionId, who: Caller = TenantDep) -> schemas.Deleted:
        first = await delete_memories(self.stores, who.tenant, session=session_id)
        removed = await self.stores.log.delete(who.tenant, session_id)
        # A memorizer that read the log before the delete may have upserted since: sweep again.
        again = await delete_memories(self.stores, who.tenant, session=session_id)
        counts = {name: first[name] + again[name] for name in first}
        if not removed and not any(counts.values()):
            raise SessionNotFound(session_id)
        return schemas.Deleted(deleted=True, details={"session": int(removed), **counts})

    @app.post("/v1/context", response_model=schemas.ContextResponse, summary="Build the prompt for the next call")
    async def context(self, body: schemas.ContextRequestIn, who: Caller = TenantDep) -> schemas.ContextResponse:
        response = await build_working_memory(
            body,
            who.tenant,
            self.stores,
            self._embed_one,
            self.settings,
            observe_recall_ms=lambda ms: self.recall_latency.observe(ms, tags={"path": "context"}),
        )
        self.context_tokens.observe(response.usage.total_tokens)
        for section, usage in response.usage.sections.items():
            self.section_tokens.observe(usage.tokens, tags={"section": section})
        return response

    @app.post("/v1/sessions/{session_id}/compress", response_model=schemas.CompressResponse, summary="Compact now")
    async def compress(self, session_id: str = SessionId, who: Caller = TenantDep) -> schemas.CompressResponse:
        """Runs in the memorizer, which owns the summarizer (and its LLM, when one is configured)."""
        await self._meta_or_404(who.tenant, session_id)
        try:
            outcome = await self.memorizer.compress.remote(who.tenant, session_id)
        except RayTaskError as exc:  # re-raise the memorizer's own error so the handlers map it
            raise exc.as_instanceof_cause() from None
        return schemas.CompressResponse(session_id=session_id, **outcome)

    @app.get("/v1/users/{user_id}/sessions", response_model=schemas.UserSessions, summary="A user's live sessions")
    async def user_sessions(self, user_id: str = UserId, who: Caller = TenantDep) -> schemas.UserSessions:
        sessions = await self.stores.log.user_sessions(who.tenant, user_id)
        return schemas.UserSessions(
            user_id=user_id,
            sessions=[{"session_id": s, "updated_at": ms_to_datetime(ms).isoformat()} for s, ms in sessions],
        )

    @app.delete("/v1/users/{user_id}", response_model=schemas.Deleted, summary="Forget a user everywhere")
    async def forget(self, user_id: str = UserId, who: Caller = TenantDep) -> schemas.Deleted:
        """Sessions, vectors and facts (with their history) of the user, in every store; a tombstone
        stops a memorizer that is still working on the user from writing anything back."""
        removed = await forget_user(self.stores, who.tenant, user_id)
        return schemas.Deleted(deleted=any(removed.values()), details=removed)

    @app.get("/v1/users/{user_id}/facts", response_model=list[schemas.FactOut], summary="Current facts")
    async def list_facts(self, user_id: str = UserId, who: Caller = TenantDep) -> list[schemas.FactOut]:
        return [schemas.FactOut(**f.__dict__) for f in await self.stores.facts.current(who.tenant, user_id)]

    @app.get("/v1/users/{user_id}/facts/{key}", response_model=schemas.FactOut, summary="One current fact")
    async def get_fact(self, user_id: str = UserId, key: str = FactKey, who: Caller = TenantDep):
        fact = await self.stores.facts.get(who.tenant, user_id, key)
        if fact is None:
            return _error(404, "fact not found")
        return schemas.FactOut(**fact.__dict__)

    @app.put("/v1/users/{user_id}/facts/{key}", response_model=schemas.FactWrite, summary="Set a fact (supersedes)")
    async def put_fact(
        self, body: schemas.FactIn, user_id: str = UserId, key: str = FactKey, who: Caller = TenantDep
    ) -> schemas.FactWrite:
        fact, changed = await self.stores.facts.put(
            who.tenant, user_id, key, body.value, body.category, source_session=body.source_session, source_seqs=body.source_seqs
        )
        return schemas.FactWrite(fact=schemas.FactOut(**fact.__dict__), changed=changed)

    @app.delete("/v1/users/{user_id}/facts/{key}", response_model=schemas.Deleted, summary="Close a fact")
    async def delete_fact(self, user_id: str = UserId, key: str = FactKey, who: Caller = TenantDep):
        if not await self.stores.facts.delete(who.tenant, user_id, key):
            return _error(404, "fact not found")
        return schemas.Deleted(deleted=True, details={"facts": 1})

    @app.get("/v1/users/{user_id}/facts/{key}/history", response_model=list[schemas.FactOut], summary="Every version")
    async def fact_history(self, user_id: str = UserId, key: str = FactKey, who: Caller = TenantDep):
        rows = await self.stores.facts.history(who.tenant, user_id, key)
        if not rows:
            return _error(404, "fact not found")
        return [schemas.FactOut(**f.__dict__) for f in rows]

    @app.post("/v1/users/{user_id}/memories", response_model=schemas.MemoryOut, summary="Add a memory directly")
    async def add_memory(self, body: schemas.MemoryIn, user_id: str = UserId, who: Caller = TenantDep) -> schemas.MemoryOut:
        await self._check_quota(who.tenant, 1)
        created = body.created_at or datetime.now(timezone.utc)
        memory_id = body.id or direct_memory_id(who.tenant, user_id, body.text)
        vector = await self._embed_one(body.text)
        row = MemoryRow(
            memory_id,
            who.tenant,
            user_id,
            "",
            0,
            "memory",
            "memory",
            body.text,
            int(created.timestamp() * 1000),
            vector,
            keywords=memory_keywords(body.text, day=created.date(), weight=self.settings.recall_keyword_self_weight),
        )
        await save_memories(self.stores, [row])
        return schemas.MemoryOut(
            id=memory_id, text=body.text, session_id="", seq=0, role="memory", kind="memory", created_at=created
        )

    @app.get("/v1/users/{user_id}/memories", response_model=list[schemas.MemoryOut], summary="List memories")
    async def list_memories(
        self,
        user_id: str = UserId,
        limit: int = Query(100, ge=1, le=1000),
        offset: int = Query(0, ge=0, le=16384),
        who: Caller = TenantDep,
    ) -> list[schemas.MemoryOut]:
        rows = await self.stores.vectors.list(who.tenant, user_id, limit=limit, offset=offset)
        return [
            schemas.MemoryOut(
                id=r["id"],
                text=r["text"],
                session_id=r["session_id"],
                seq=r["seq"],
                role=r["role"],
                kind=r["kind"],
                created_at=ms_to_datetime(r["created_at"]),
            )
            for r in rows
        ]

    @app.delete("/v1/users/{user_id}/memories/{memory_id}", response_model=schemas.Deleted, summary="Delete a memory")
    async def delete_memory(
        self, user_id: str = UserId, memory_id: str = Path(pattern=ID_PATTERN, max_length=128), who: Caller = TenantDep
    ):
        removed = await delete_memories(self.stores, who.tenant, user=user_id, memory_id=memory_id)
        if not any(removed.values()):
            return _error(404, "memory not found")
        return schemas.Deleted(deleted=True, details=removed)

    @app.post(
        "/v1/users/{user_id}/memories/search",
        response_model=list[schemas.SearchHit],
        summary="Hybrid search (dense + BM25 keywords, rank-fused)",
    )
    async def search(
        self, body: schemas.SearchRequest, user_id: str = UserId, who: Caller = TenantDep
    ) -> list[schemas.SearchHit]:
        found = await recall(
            self.stores,
            self._embed_one,
            who.tenant,
            user_id,
            body.query,
            top_k=body.top_k,
            settings=self.settings,
            min_score=body.min_score,
            observe_ms=lambda ms: self.recall_latency.observe(ms, tags={"path": "search"}),
        )
        return [hit_out(h) for h in found.hits]

    async def __del__(self):
        if hasattr(self, "stores"):
            await self.stores.close()
