"""`MemoryClient` and `AsyncMemoryClient`: the whole API v1, typed, with safe retries.

Every endpoint is described once (`_Endpoints`: method, path, body, response model) and executed by
a sync or an async transport, so the two clients cannot differ. Appends carry client-side message
ids (made when the caller gives none) so that a retried append is stored once; 429 and 503 are
retried after the server's `Retry-After`, a bounded number of times and never longer than
`max_retry_wait_s` (a quota's hour-long Retry-After is raised at once).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, ParamSpec, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter

from agent_memory_client import models as m

T = TypeVar("T")
P = ParamSpec("P")
RETRIED_STATUSES = frozenset({429, 503})
RETRIED_ERRORS = (httpx.ConnectError, httpx.ReadTimeout, httpx.WriteTimeout, httpx.RemoteProtocolError)
ARCHIVE_MEDIA_TYPE = "application/x-ndjson"


class MemoryAPIError(Exception):
    """The service answered with an error: its status, its `detail` and headers."""

    def __init__(self, status_code: int, detail: Any, headers: dict[str, str] | None = None):
        super().__init__(f"{status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail
        self.headers = headers or {}


class NotFound(MemoryAPIError): ...


class Conflict(MemoryAPIError): ...


class Unauthorized(MemoryAPIError): ...


class InvalidRequest(MemoryAPIError): ...


class RateLimited(MemoryAPIError): ...


class Unavailable(MemoryAPIError): ...


_ERRORS = {401: Unauthorized, 404: NotFound, 409: Conflict, 413: InvalidRequest, 422: InvalidRequest, 429: RateLimited}


def _error(response: httpx.Response) -> MemoryAPIError:
    try:
        detail = response.json().get("detail", response.text)
    except ValueError:
        detail = response.text
    kind = _ERRORS.get(response.status_code, Unavailable if response.status_code >= 500 else MemoryAPIError)
    return kind(response.status_code, detail, dict(response.headers))


@dataclass
class Call(Generic[T]):
    """One request of the API and how to read its answer."""

    method: str
    path: str
    returns: Any
    json: Any = None
    params: dict[str, Any] = field(default_factory=dict)
    content: bytes | None = None
    """A body that is not JSON (a user archive), sent as `application/x-ndjson`."""

    def read(self, response: httpx.Response) -> T:
        if response.status_code >= 400:
            raise _error(response)
        if self.returns is str:  # a user archive: JSON Lines, as they came
            return response.text  # type: ignore[return-value]
        return TypeAdapter(self.returns).validate_python(response.json())

    def request(self) -> dict[str, Any]:
        """httpx's arguments for this call."""
        if self.content is not None:
            return {"content": self.content, "headers": {"Content-Type": ARCHIVE_MEDIA_TYPE}, "params": self.params or None}
        return {"json": self.json, "params": self.params or None}


def _body(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json", exclude_none=True)


def _messages(messages: list[m.MessageIn | dict[str, Any]]) -> list[m.MessageIn]:
    """Messages with a client id each: made here when the caller gave none, once, so a retry of the
    same request sends the same ids and the service stores each message once."""
    out = []
    for message in messages:
        parsed = message if isinstance(message, m.MessageIn) else m.MessageIn.model_validate(message)
        out.append(parsed if parsed.id else parsed.model_copy(update={"id": "c-" + uuid.uuid4().hex}))
    return out


class _Endpoints:
    """Every endpoint of API v1 once: the clients run these calls."""

    @staticmethod
    def health() -> Call[m.Health]:
        return Call("GET", "/healthz", m.Health)

    @staticmethod
    def append(
        session_id: str,
        user_id: str,
        messages: list[m.MessageIn | dict[str, Any]],
        *,
        agent_id: str | None = None,
        space: str | None = None,
    ) -> Call[m.AppendResponse]:
        """Store turns in the session; `space`: memorize them into that memory space (write grant)."""
        body = m.AppendRequest(user_id=user_id, messages=_messages(messages), agent_id=agent_id, space=space)
        return Call("POST", f"/v1/sessions/{session_id}/messages", m.AppendResponse, _body(body))

    @staticmethod
    def session(session_id: str) -> Call[m.SessionInfo]:
        return Call("GET", f"/v1/sessions/{session_id}", m.SessionInfo)

    @staticmethod
    def messages(session_id: str, after: int = 0, limit: int = 100) -> Call[m.MessagesPage]:
        return Call("GET", f"/v1/sessions/{session_id}/messages", m.MessagesPage, params={"after": after, "limit": limit})

    @staticmethod
    def delete_session(session_id: str) -> Call[m.Deleted]:
        return Call("DELETE", f"/v1/sessions/{session_id}", m.Deleted)

    @staticmethod
    def compress(session_id: str) -> Call[m.CompressResponse]:
        return Call("POST", f"/v1/sessions/{session_id}/compress", m.CompressResponse)

    @staticmethod
    def context(
        user_id: str,
        session_id: str,
        query: str = "",
        *,
        system_prompt: str | None = None,
        tool_results: list[m.ToolResultIn] | None = None,
        max_tokens: int | None = None,
        reserve_output: int | None = None,
        shares: m.BudgetShares | None = None,
        top_k: int | None = None,
        min_score: float | None = None,
        min_probability: float | None = None,
        spaces: list[str] | None = None,
    ) -> Call[m.ContextResponse]:
        body = m.ContextRequestIn(
            user_id=user_id,
            session_id=session_id,
            query=query,
            system_prompt=system_prompt,
            tool_results=tool_results or [],
            max_tokens=max_tokens,
            reserve_output=reserve_output,
            shares=shares,
            top_k=top_k,
            min_score=min_score,
            min_probability=min_probability,
            spaces=spaces or [],
        )
        return Call("POST", "/v1/context", m.ContextResponse, _body(body))

    @staticmethod
    def user_sessions(user_id: str) -> Call[m.UserSessions]:
        return Call("GET", f"/v1/users/{user_id}/sessions", m.UserSessions)

    @staticmethod
    def forget_user(user_id: str) -> Call[m.Deleted]:
        return Call("DELETE", f"/v1/users/{user_id}", m.Deleted)

    @staticmethod
    def facts(user_id: str) -> Call[list[m.FactOut]]:
        return Call("GET", f"/v1/users/{user_id}/facts", list[m.FactOut])

    @staticmethod
    def fact(user_id: str, key: str) -> Call[m.FactOut]:
        return Call("GET", f"/v1/users/{user_id}/facts/{key}", m.FactOut)

    @staticmethod
    def set_fact(
        user_id: str,
        key: str,
        value: str,
        category: m.FactCategory = "fact",
        *,
        source_session: str | None = None,
        agent_id: str | None = None,
    ) -> Call[m.FactWrite]:
        body = m.FactIn(value=value, category=category, source_session=source_session, agent_id=agent_id)
        return Call("PUT", f"/v1/users/{user_id}/facts/{key}", m.FactWrite, _body(body))

    @staticmethod
    def delete_fact(user_id: str, key: str) -> Call[m.Deleted]:
        return Call("DELETE", f"/v1/users/{user_id}/facts/{key}", m.Deleted)

    @staticmethod
    def fact_history(user_id: str, key: str) -> Call[list[m.FactOut]]:
        return Call("GET", f"/v1/users/{user_id}/facts/{key}/history", list[m.FactOut])

    @staticmethod
    def add_memory(
        user_id: str,
        text: str,
        *,
        memory_id: str | None = None,
        created_at: datetime | None = None,
        agent_id: str | None = None,
    ) -> Call[m.MemoryOut]:
        body = m.MemoryIn(text=text, id=memory_id, created_at=created_at, agent_id=agent_id)
        return Call("POST", f"/v1/users/{user_id}/memories", m.MemoryOut, _body(body))

    @staticmethod
    def memories(user_id: str, limit: int = 100, offset: int = 0) -> Call[list[m.MemoryOut]]:
        return Call("GET", f"/v1/users/{user_id}/memories", list[m.MemoryOut], params={"limit": limit, "offset": offset})

    @staticmethod
    def delete_memory(user_id: str, memory_id: str) -> Call[m.Deleted]:
        return Call("DELETE", f"/v1/users/{user_id}/memories/{memory_id}", m.Deleted)

    @staticmethod
    def search(
        user_id: str, query: str, top_k: int = 10, min_score: float | None = None, *, spaces: list[str] | None = None
    ) -> Call[list[m.SearchHit]]:
        """The user's memories (and those of the named spaces, each hit naming its space), best first."""
        body = m.SearchRequest(query=query, top_k=top_k, min_score=min_score, spaces=spaces or [])
        return Call("POST", f"/v1/users/{user_id}/memories/search", list[m.SearchHit], _body(body))

    @staticmethod
    def explain_search(user_id: str, query: str, top_k: int = 10, min_score: float | None = None) -> Call[m.SearchExplained]:
        """The same search with every candidate's dense, keyword and fused scores, kept or dropped."""
        body = m.SearchRequest(query=query, top_k=top_k, min_score=min_score, explain=True)
        return Call("POST", f"/v1/users/{user_id}/memories/search", m.SearchExplained, _body(body))

    @staticmethod
    def users(after: str = "", limit: int = 50) -> Call[m.UsersPage]:
        return Call("GET", "/v1/users", m.UsersPage, params={"after": after, "limit": limit})

    @staticmethod
    def audit(before: int | None = None, limit: int = 50) -> Call[m.AuditPage]:
        params: dict[str, Any] = {"limit": limit} | ({"before": before} if before is not None else {})
        return Call("GET", "/v1/audit", m.AuditPage, params=params)

    @staticmethod
    def stats() -> Call[m.Stats]:
        return Call("GET", "/v1/stats", m.Stats)

    @staticmethod
    def export_session(session_id: str) -> Call[m.SessionExport]:
        return Call("GET", f"/v1/sessions/{session_id}/export", m.SessionExport)

    @staticmethod
    def export_user(user_id: str, vectors: bool = True) -> Call[str]:
        """The user's archive (JSON Lines): sessions, memories (with their vectors), facts with their history."""
        return Call("GET", f"/v1/users/{user_id}/export", str, params={"vectors": vectors})

    @staticmethod
    def import_user(user_id: str, archive: str | bytes) -> Call[m.ImportReport]:
        """Take an archive `export_user` gave into this user: idempotent, all checked before any write."""
        content = archive.encode("utf-8") if isinstance(archive, str) else archive
        return Call("POST", f"/v1/users/{user_id}/import", m.ImportReport, content=content)

    @staticmethod
    def create_space(space_id: str, quota_memories: int | None = None) -> Call[m.SpaceOut]:
        """A memory space of the tenant (needs the tenant's admin key); its creator holds admin on it."""
        return Call("POST", "/v1/spaces", m.SpaceOut, _body(m.SpaceIn(space_id=space_id, quota_memories=quota_memories)))

    @staticmethod
    def spaces() -> Call[list[m.SpaceOut]]:
        return Call("GET", "/v1/spaces", list[m.SpaceOut])

    @staticmethod
    def space(space_id: str) -> Call[m.SpaceOut]:
        return Call("GET", f"/v1/spaces/{space_id}", m.SpaceOut)

    @staticmethod
    def delete_space(space_id: str) -> Call[m.Deleted]:
        return Call("DELETE", f"/v1/spaces/{space_id}", m.Deleted)

    @staticmethod
    def grants(space_id: str) -> Call[list[m.GrantOut]]:
        return Call("GET", f"/v1/spaces/{space_id}/grants", list[m.GrantOut])

    @staticmethod
    def grant(space_id: str, principal: str, role: m.SpaceRole) -> Call[m.GrantOut]:
        """Give a key (`key:<first 12 hex of its SHA-256>`) a role on the space (needs admin on it)."""
        return Call("PUT", f"/v1/spaces/{space_id}/grants/{principal}", m.GrantOut, _body(m.GrantIn(role=role)))

    @staticmethod
    def revoke(space_id: str, principal: str) -> Call[m.Deleted]:
        return Call("DELETE", f"/v1/spaces/{space_id}/grants/{principal}", m.Deleted)

    @staticmethod
    def add_space_memory(
        space_id: str, text: str, *, memory_id: str | None = None, agent_id: str | None = None
    ) -> Call[m.MemoryOut]:
        body = m.MemoryIn(text=text, id=memory_id, agent_id=agent_id)
        return Call("POST", f"/v1/spaces/{space_id}/memories", m.MemoryOut, _body(body))

    @staticmethod
    def space_memories(space_id: str, after: str = "", limit: int = 100) -> Call[list[m.MemoryOut]]:
        return Call("GET", f"/v1/spaces/{space_id}/memories", list[m.MemoryOut], params={"after": after, "limit": limit})

    @staticmethod
    def search_space(space_id: str, query: str, top_k: int = 10) -> Call[list[m.SearchHit]]:
        body = m.SearchRequest(query=query, top_k=top_k)
        return Call("POST", f"/v1/spaces/{space_id}/memories/search", list[m.SearchHit], _body(body))

    @staticmethod
    def space_facts(space_id: str) -> Call[list[m.FactOut]]:
        return Call("GET", f"/v1/spaces/{space_id}/facts", list[m.FactOut])

    @staticmethod
    def set_space_fact(
        space_id: str, key: str, value: str, category: m.FactCategory = "fact", *, agent_id: str | None = None
    ) -> Call[m.FactWrite]:
        body = m.FactIn(value=value, category=category, agent_id=agent_id)
        return Call("PUT", f"/v1/spaces/{space_id}/facts/{key}", m.FactWrite, _body(body))

    @staticmethod
    def promote_memory(user_id: str, memory_id: str, space: str, *, agent_id: str | None = None) -> Call[m.MemoryOut]:
        """Copy one of the user's memories into a space, with where it came from (needs write on the space)."""
        body = m.PromoteIn(space=space, agent_id=agent_id)
        return Call("POST", f"/v1/users/{user_id}/memories/{memory_id}/promote", m.MemoryOut, _body(body))

    @staticmethod
    def promote_fact(user_id: str, key: str, space: str, *, agent_id: str | None = None) -> Call[m.FactWrite]:
        body = m.PromoteIn(space=space, agent_id=agent_id)
        return Call("POST", f"/v1/users/{user_id}/facts/{key}/promote", m.FactWrite, _body(body))

    @staticmethod
    def export_space(space_id: str, vectors: bool = True) -> Call[str]:
        return Call("GET", f"/v1/spaces/{space_id}/export", str, params={"vectors": vectors})


def _headers(api_key: str | None) -> dict[str, str]:
    key = api_key if api_key is not None else os.environ.get("MEMSERVE_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def _wait_s(attempt: int, response: httpx.Response | None) -> float:
    """The server's Retry-After when it gave one, else a short exponential back-off."""
    if response is not None:
        try:
            return float(response.headers.get("retry-after", ""))
        except ValueError:
            pass
    return min(8.0, 0.25 * 2**attempt)


class _Retrying:
    def __init__(self, max_retries: int, max_retry_wait_s: float):
        self.max_retries = max_retries
        self.max_retry_wait_s = max_retry_wait_s

    def next_wait(self, attempt: int, response: httpx.Response | None) -> float | None:
        """How long to wait before the next attempt, or None to give up (answer or raise as is)."""
        if attempt >= self.max_retries:
            return None
        if response is not None and response.status_code not in RETRIED_STATUSES:
            return None
        wait = _wait_s(attempt, response)
        return wait if wait <= self.max_retry_wait_s else None


def _sync(build: Callable[P, Call[T]]) -> Callable[P, T]:
    def call(self: MemoryClient, *args: P.args, **kwargs: P.kwargs) -> T:
        return self.send(build(*args, **kwargs))

    call.__doc__, call.__name__ = build.__doc__, build.__name__
    return call  # type: ignore[return-value]


def _async(build: Callable[P, Call[T]]) -> Callable[P, Awaitable[T]]:
    async def call(self: AsyncMemoryClient, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self.send(build(*args, **kwargs))

    call.__doc__, call.__name__ = build.__doc__, build.__name__
    return call  # type: ignore[return-value]


class MemoryClient(_Retrying):
    """Sync client. `api_key` defaults to `MEMSERVE_API_KEY`; loopback services without keys need none."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        api_key: str | None = None,
        *,
        timeout_s: float = 60.0,
        max_retries: int = 3,
        max_retry_wait_s: float = 30.0,
        http: httpx.Client | None = None,
    ):
        super().__init__(max_retries, max_retry_wait_s)
        self.http = http or httpx.Client(base_url=base_url, timeout=timeout_s, headers=_headers(api_key))

    def send(self, call: Call[T]) -> T:
        for attempt in range(self.max_retries + 1):
            try:
                response = self.http.request(call.method, call.path, **call.request())
            except RETRIED_ERRORS:
                if (wait := self.next_wait(attempt, None)) is None:
                    raise
            else:
                if (wait := self.next_wait(attempt, response)) is None:
                    return call.read(response)
            time.sleep(wait)
        raise AssertionError("unreachable: the last attempt answers or raises")

    def iter_messages(self, session_id: str, page: int = 100) -> Iterator[m.StoredMessage]:
        """Every message of a session, page by page."""
        after: int | None = 0
        while after is not None:
            got = self.messages(session_id, after=after, limit=page)
            yield from got.messages
            after = got.next_after

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> MemoryClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    health = _sync(_Endpoints.health)
    append = _sync(_Endpoints.append)
    session = _sync(_Endpoints.session)
    messages = _sync(_Endpoints.messages)
    delete_session = _sync(_Endpoints.delete_session)
    compress = _sync(_Endpoints.compress)
    context = _sync(_Endpoints.context)
    user_sessions = _sync(_Endpoints.user_sessions)
    forget_user = _sync(_Endpoints.forget_user)
    facts = _sync(_Endpoints.facts)
    fact = _sync(_Endpoints.fact)
    set_fact = _sync(_Endpoints.set_fact)
    delete_fact = _sync(_Endpoints.delete_fact)
    fact_history = _sync(_Endpoints.fact_history)
    add_memory = _sync(_Endpoints.add_memory)
    memories = _sync(_Endpoints.memories)
    delete_memory = _sync(_Endpoints.delete_memory)
    search = _sync(_Endpoints.search)
    explain_search = _sync(_Endpoints.explain_search)
    users = _sync(_Endpoints.users)
    audit = _sync(_Endpoints.audit)
    stats = _sync(_Endpoints.stats)
    export_session = _sync(_Endpoints.export_session)
    export_user = _sync(_Endpoints.export_user)
    import_user = _sync(_Endpoints.import_user)
    create_space = _sync(_Endpoints.create_space)
    spaces = _sync(_Endpoints.spaces)
    space = _sync(_Endpoints.space)
    delete_space = _sync(_Endpoints.delete_space)
    grants = _sync(_Endpoints.grants)
    grant = _sync(_Endpoints.grant)
    revoke = _sync(_Endpoints.revoke)
    add_space_memory = _sync(_Endpoints.add_space_memory)
    space_memories = _sync(_Endpoints.space_memories)
    search_space = _sync(_Endpoints.search_space)
    space_facts = _sync(_Endpoints.space_facts)
    set_space_fact = _sync(_Endpoints.set_space_fact)
    promote_memory = _sync(_Endpoints.promote_memory)
    promote_fact = _sync(_Endpoints.promote_fact)
    export_space = _sync(_Endpoints.export_space)


class AsyncMemoryClient(_Retrying):
    """Async client, the same calls as `MemoryClient`."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        api_key: str | None = None,
        *,
        timeout_s: float = 60.0,
        max_retries: int = 3,
        max_retry_wait_s: float = 30.0,
        http: httpx.AsyncClient | None = None,
    ):
        super().__init__(max_retries, max_retry_wait_s)
        self.http = http or httpx.AsyncClient(base_url=base_url, timeout=timeout_s, headers=_headers(api_key))

    async def send(self, call: Call[T]) -> T:
        for attempt in range(self.max_retries + 1):
            try:
                response = await self.http.request(call.method, call.path, **call.request())
            except RETRIED_ERRORS:
                if (wait := self.next_wait(attempt, None)) is None:
                    raise
            else:
                if (wait := self.next_wait(attempt, response)) is None:
                    return call.read(response)
            await asyncio.sleep(wait)
        raise AssertionError("unreachable: the last attempt answers or raises")

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncMemoryClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    health = _async(_Endpoints.health)
    append = _async(_Endpoints.append)
    session = _async(_Endpoints.session)
    messages = _async(_Endpoints.messages)
    delete_session = _async(_Endpoints.delete_session)
    compress = _async(_Endpoints.compress)
    context = _async(_Endpoints.context)
    user_sessions = _async(_Endpoints.user_sessions)
    forget_user = _async(_Endpoints.forget_user)
    facts = _async(_Endpoints.facts)
    fact = _async(_Endpoints.fact)
    set_fact = _async(_Endpoints.set_fact)
    delete_fact = _async(_Endpoints.delete_fact)
    fact_history = _async(_Endpoints.fact_history)
    add_memory = _async(_Endpoints.add_memory)
    memories = _async(_Endpoints.memories)
    delete_memory = _async(_Endpoints.delete_memory)
    search = _async(_Endpoints.search)
    explain_search = _async(_Endpoints.explain_search)
    users = _async(_Endpoints.users)
    audit = _async(_Endpoints.audit)
    stats = _async(_Endpoints.stats)
    export_session = _async(_Endpoints.export_session)
    export_user = _async(_Endpoints.export_user)
    import_user = _async(_Endpoints.import_user)
    create_space = _async(_Endpoints.create_space)
    spaces = _async(_Endpoints.spaces)
    space = _async(_Endpoints.space)
    delete_space = _async(_Endpoints.delete_space)
    grants = _async(_Endpoints.grants)
    grant = _async(_Endpoints.grant)
    revoke = _async(_Endpoints.revoke)
    add_space_memory = _async(_Endpoints.add_space_memory)
    space_memories = _async(_Endpoints.space_memories)
    search_space = _async(_Endpoints.search_space)
    space_facts = _async(_Endpoints.space_facts)
    set_space_fact = _async(_Endpoints.set_space_fact)
    promote_memory = _async(_Endpoints.promote_memory)
    promote_fact = _async(_Endpoints.promote_fact)
    export_space = _async(_Endpoints.export_space)
