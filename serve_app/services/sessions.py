"""Short-term memory over the API: append with limits, read the log, delete, compact on demand."""

from __future__ import annotations

from datetime import UTC, datetime

from serve_app import schemas
from serve_app.core.auth import Caller
from serve_app.core.clock import ms_to_datetime
from serve_app.errors import SessionNotFound
from serve_app.runtime import tracing
from serve_app.services.dependencies import Dependencies
from serve_app.services.memory_writes import delete_memories
from serve_app.services.quota import check_memory_quota
from serve_app.services.spaces import check_space_quota, require
from serve_app.stores.session_log import SessionMeta


async def append_messages(
    deps: Dependencies, caller: Caller, session_id: str, body: schemas.AppendRequest
) -> schemas.AppendResponse:
    """Store the messages after the rate limit and quota checks; a retried client id is stored once.

    Only Redis is touched: the memorizer finds the session in the pending set at its next sweep
    (or at once, when `memorizer_poke` is on)."""
    attributes = {
        "memory.operation": "append",
        "memory.tenant": caller.tenant,
        "memory.user": body.user_id,
        "memory.session": session_id,
        "memory.store": "redis",
        "memory.messages": len(body.messages),
    }
    with tracing.span("memory.append", attributes=attributes):
        return await _append(deps, caller, session_id, body)


async def _append(deps: Dependencies, caller: Caller, session_id: str, body: schemas.AppendRequest) -> schemas.AppendResponse:
    settings = deps.settings
    limit = settings.rate_limit_overrides.get(caller.tenant, settings.rate_limit_messages_per_minute)
    await deps.stores.rate_limits.spend(caller.key_digest, len(body.messages), limit)
    await check_memory_quota(deps, caller.tenant, len(body.messages))
    if body.space is not None:
        await require(deps, caller, body.space, "write")
        await check_space_quota(deps, caller.tenant, body.space, len(body.messages))
    now = datetime.now(UTC)
    stored = [m.stored(now) for m in body.messages]
    written_by = {k: v for k, v in (("agent_id", body.agent_id), ("space", body.space)) if v is not None}
    if written_by:  # the memorizer reads them from the log: who said it, and whose memory it becomes
        stored = [message | written_by for message in stored]
    result = await deps.stores.log.append(caller.tenant, session_id, body.user_id, stored)
    if deps.poke is not None and not all(result.duplicates):
        deps.poke(caller.tenant, session_id)
    return schemas.AppendResponse(session_id=session_id, seqs=result.seqs, duplicates=result.duplicates)


async def existing_session(deps: Dependencies, tenant: str, session_id: str) -> SessionMeta:
    meta = await deps.stores.log.meta(tenant, session_id)
    if meta is None:
        raise SessionNotFound(session_id)
    return meta


async def describe_session(deps: Dependencies, tenant: str, session_id: str) -> schemas.SessionInfo:
    meta = await existing_session(deps, tenant, session_id)
    return schemas.SessionInfo(
        session_id=session_id,
        user_id=meta.user_id,
        message_count=meta.message_count,
        covers_upto_seq=meta.covers_upto_seq,
        memorized_upto_seq=meta.memorized_upto_seq,
        extracted_upto_seq=meta.extracted_upto_seq,
        remembered_upto_seq=meta.remembered_upto_seq,
        summary_version=meta.version,
        summary_degraded=meta.summary_degraded,
        created_at=ms_to_datetime(meta.created_at_ms),
        updated_at=ms_to_datetime(meta.updated_at_ms),
    )


async def read_page(deps: Dependencies, tenant: str, session_id: str, *, after: int, limit: int) -> schemas.MessagesPage:
    meta = await existing_session(deps, tenant, session_id)
    rows = await deps.stores.log.read(tenant, session_id, after=after, limit=limit)
    last = rows[-1]["seq"] if rows else after
    return schemas.MessagesPage(
        session_id=session_id,
        messages=[schemas.StoredMessage(**r) for r in rows],
        summary=meta.summary,
        covers_upto_seq=meta.covers_upto_seq,
        next_after=last if last < meta.message_count else None,
    )


async def delete_session(deps: Dependencies, tenant: str, session_id: str) -> schemas.Deleted:
    """The log, its checkpoint and the session's memories in both indexes.

    A live session takes only its owner's memories: another user's, made under the same id before
    its log expired, stay. A session whose log has expired takes every memory made under its id."""
    meta = await deps.stores.log.meta(tenant, session_id)
    owner = meta.user_id if meta is not None else None
    first = await delete_memories(deps.stores, tenant, user=owner, session=session_id)
    removed = await deps.stores.log.delete(tenant, session_id)
    # A memorizer that read the log before the delete may have upserted since: sweep again.
    again = await delete_memories(deps.stores, tenant, user=owner, session=session_id)
    counts = {name: first[name] + again[name] for name in first}
    if not removed and not any(counts.values()):
        raise SessionNotFound(session_id)
    return schemas.Deleted(deleted=True, details={"session": int(removed), **counts})


async def compress_session(deps: Dependencies, tenant: str, session_id: str) -> schemas.CompressResponse:
    """Compact now, where the summarizer (and its LLM, when one is configured) lives."""
    attributes = {"memory.operation": "compress", "memory.tenant": tenant, "memory.session": session_id}
    with tracing.span("memory.compress", attributes=attributes):
        await existing_session(deps, tenant, session_id)
        outcome = await deps.compact_now(tenant, session_id)
    return schemas.CompressResponse(session_id=session_id, **outcome)


async def user_sessions(deps: Dependencies, tenant: str, user_id: str) -> schemas.UserSessions:
    sessions = await deps.stores.log.user_sessions(tenant, user_id)
    return schemas.UserSessions(
        user_id=user_id,
        sessions=[{"session_id": s, "updated_at": ms_to_datetime(ms).isoformat()} for s, ms in sessions],
    )
