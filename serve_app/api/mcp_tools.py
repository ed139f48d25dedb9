"""MCP tools at `/mcp` (streamable HTTP, stateless: any Ingress replica answers any call).

Each tool is the service function its REST route calls, taking the fields of the REST API's request
model as flat arguments (`mcp_arguments.py`), so validation, limits and the tenant (from the same API
key, sent as a header) are the same. A request without a valid key is refused with a 401 before MCP reads it.
"""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import Field
from starlette.datastructures import Headers
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from serve_app import schemas
from serve_app.api.error_responses import as_service_error, error_response
from serve_app.api.mcp_arguments import flattened
from serve_app.core.auth import Caller
from serve_app.core.hosts import HostPolicy
from serve_app.core.ids import ID_PATTERN, MAX_ID_LENGTH
from serve_app.core.spaces import SPACE_PATTERN
from serve_app.errors import ServiceError, Unauthorized
from serve_app.services import memories, sessions, spaces, user_archive, users
from serve_app.services.audit import audited
from serve_app.services.context import build_working_memory
from serve_app.services.dependencies import Dependencies

MCP_PATH = "/mcp"
UserIdArg = Annotated[str, Field(pattern=ID_PATTERN, max_length=MAX_ID_LENGTH, description="User id.")]
SessionIdArg = Annotated[str, Field(pattern=ID_PATTERN, max_length=MAX_ID_LENGTH, description="Session id.")]
MemoryIdArg = Annotated[
    str, Field(pattern=ID_PATTERN, max_length=MAX_ID_LENGTH, description="Memory id (from add_memory or search).")
]
SpaceArg = Annotated[str, Field(pattern=SPACE_PATTERN, description="Memory space id (list_spaces names them).")]
KeyArg = Annotated[str, Field(pattern=ID_PATTERN, max_length=MAX_ID_LENGTH, description="Fact key, e.g. shipping_address.")]

INSTRUCTIONS = (
    "Long-term memory of users across sessions. search_memory recalls what a user said before; get_context "
    "builds the prompt for the next model call inside a token budget; append_messages stores a session's turns "
    "(memorized in the background); add_memory and set_fact store what should be remembered explicitly. "
    "Memory spaces are memory a team of agents shares: name them in `spaces` to read them, write with "
    "add_space_memory or append_messages' `space`, and copy a user's memory in with promote_memory."
)


def caller_of(deps: Dependencies, headers: Headers | Any) -> Caller:
    """The tenant from the API key in `Authorization: Bearer` or `X-API-Key`, as the REST API reads it."""
    if not deps.keyring.enabled:
        return Caller(deps.settings.default_tenant, "local", via="mcp", admin=True)
    key = headers.get("x-api-key") if headers is not None else None
    auth = headers.get("authorization", "") if headers is not None else ""
    if not key and auth.lower().startswith("bearer "):
        key = auth[7:].strip()
    found = deps.keyring.tenant_for(key)
    if found is None:
        raise Unauthorized()
    return Caller(*found, via="mcp", admin=deps.keyring.is_admin(found[1]))


class KeyRequired:
    """The MCP endpoint behind the API key: a request without a valid one gets the API's 401."""

    def __init__(self, inner: ASGIApp, deps: Dependencies):
        self.inner = inner
        self.deps = deps

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            caller_of(self.deps, Headers(scope=scope))
        except ServiceError as refused:
            await error_response(refused)(scope, receive, send)
            return
        await self.inner(scope, receive, send)


async def _call(work):
    """A service error becomes the tool's error result, with the API's message."""
    try:
        return await work
    except Exception as exc:  # mapped like the REST API maps it; the message reaches the client
        error = as_service_error(exc)
        raise ToolError(f"{error.status_code}: {error.body()['detail']}") from exc


def build_mcp(deps: Dependencies) -> MCPServer:
    mcp = MCPServer("agent-memory-serve", instructions=INSTRUCTIONS)

    def who(ctx: Context) -> Caller:
        return caller_of(deps, ctx.headers)

    @mcp.tool(description="Hybrid search of a user's long-term memories (dense + keywords, rank-fused).")
    @flattened("search", schemas.SearchRequest)
    async def search_memory(
        user_id: UserIdArg, search: schemas.SearchRequest, ctx: Context
    ) -> list[schemas.SearchHit] | schemas.SearchExplained:
        caller = who(ctx)

        async def searching():
            shared = await spaces.granted_owners(deps, caller, search.spaces)
            return await memories.search_memories(deps, caller.tenant, user_id, search, shared)

        return await _call(searching())

    @mcp.tool(description="Store a memory for a user directly (the same text twice is stored once).")
    @flattened("memory", schemas.MemoryIn)
    async def add_memory(user_id: UserIdArg, memory: schemas.MemoryIn, ctx: Context) -> schemas.MemoryOut:
        caller = who(ctx)
        return await _call(memories.add_memory(deps, caller.tenant, user_id, memory, added_by=caller.actor))

    @mcp.tool(description="Delete one long-term memory of a user.")
    async def delete_memory(user_id: UserIdArg, memory_id: MemoryIdArg, ctx: Context) -> schemas.Deleted:
        caller = who(ctx)
        deleting = memories.delete_memory(deps, caller.tenant, user_id, memory_id)
        target = {"user_id": user_id, "memory_id": memory_id}
        return await _call(audited(deps, caller, "delete_memory", target, deleting))

    @mcp.tool(description="The prompt for the next model call: facts, recalled memories, summary and recent turns, in budget.")
    @flattened("context", schemas.ContextRequestIn)
    async def get_context(context: schemas.ContextRequestIn, ctx: Context) -> schemas.ContextResponse:
        caller = who(ctx)

        async def building():
            shared = await spaces.granted_owners(deps, caller, context.spaces)
            return await build_working_memory(deps, caller.tenant, context, shared=shared)

        return await _call(building())

    @mcp.tool(description="Append messages to a session's log (a retried client id is stored once).")
    @flattened("append", schemas.AppendRequest)
    async def append_messages(session_id: SessionIdArg, append: schemas.AppendRequest, ctx: Context) -> schemas.AppendResponse:
        return await _call(sessions.append_messages(deps, who(ctx), session_id, append))

    @mcp.tool(description="A user's current structured facts.")
    async def list_facts(user_id: UserIdArg, ctx: Context) -> list[schemas.FactOut]:
        return await _call(users.current_facts(deps, who(ctx).tenant, user_id))

    @mcp.tool(description="Set a user's fact; the previous value is kept in its history.")
    @flattened("fact", schemas.FactIn)
    async def set_fact(user_id: UserIdArg, key: KeyArg, fact: schemas.FactIn, ctx: Context) -> schemas.FactWrite:
        caller = who(ctx)
        return await _call(users.put_fact(deps, caller.tenant, user_id, key, fact, added_by=caller.actor))

    @mcp.tool(description="A user's whole memory as a portable archive (JSON Lines): sessions, memories, facts with history.")
    async def export_memory(
        user_id: UserIdArg,
        ctx: Context,
        vectors: Annotated[bool, Field(description="Memory lines carry their vectors (about 4.6 KB each).")] = True,
    ) -> str:
        return await _call(_joined(user_archive.export_lines(deps, who(ctx).tenant, user_id, vectors=vectors)))

    @mcp.tool(description="Import an archive export_memory gave into a user (idempotent; checked whole before any write).")
    async def import_memory(
        user_id: UserIdArg, archive: Annotated[str, Field(description="The archive's JSON Lines.")], ctx: Context
    ) -> schemas.ImportReport:
        return await _call(user_archive.import_lines(deps, who(ctx), user_id, archive.splitlines()))

    @mcp.tool(description="The memory spaces (a tenant's shared memory) this key holds a grant on, with its role.")
    async def list_spaces(ctx: Context) -> list[schemas.SpaceOut]:
        return await _call(spaces.list_spaces(deps, who(ctx)))

    @mcp.tool(description="Store a memory in a memory space the whole team reads (write grant on the space needed).")
    @flattened("memory", schemas.MemoryIn)
    async def add_space_memory(space: SpaceArg, memory: schemas.MemoryIn, ctx: Context) -> schemas.MemoryOut:
        return await _call(spaces.add_space_memory(deps, who(ctx), space, memory))

    @mcp.tool(description="Copy one of a user's memories into a memory space, with where it came from (write grant).")
    @flattened("promote", schemas.PromoteIn)
    async def promote_memory(
        user_id: UserIdArg, memory_id: MemoryIdArg, promote: schemas.PromoteIn, ctx: Context
    ) -> schemas.MemoryOut:
        return await _call(spaces.promote_memory(deps, who(ctx), user_id, memory_id, promote))

    @mcp.tool(description="Make a user's current fact a memory space's, with where it came from (write grant).")
    @flattened("promote", schemas.PromoteIn)
    async def promote_fact(user_id: UserIdArg, key: KeyArg, promote: schemas.PromoteIn, ctx: Context) -> schemas.FactWrite:
        return await _call(spaces.promote_fact(deps, who(ctx), user_id, key, promote))

    return mcp


async def _joined(lines) -> str:
    return "".join([line async for line in lines])


def transport_security(deps: Dependencies) -> TransportSecuritySettings:
    """With keys off, the SDK's own Host and Origin check, on the names the app's HostGuard admits (a
    second line should the tools ever be mounted without it). With keys on it stays off: the service
    sits behind its own proxy, under names it cannot know, and every call carries its key."""
    if deps.keyring.enabled:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    policy = HostPolicy(deps.settings.allowed_hosts)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=policy.mcp_hosts(), allowed_origins=policy.mcp_origins()
    )


def mcp_routes(mcp: MCPServer, deps: Dependencies) -> list[Route]:
    """`/mcp` itself (no redirect to `/mcp/`), JSON answers, no session: replicas share nothing."""
    app = mcp.streamable_http_app(
        streamable_http_path=MCP_PATH,
        stateless_http=True,
        json_response=True,
        transport_security=transport_security(deps),
    )
    routes = []
    for route in app.routes:
        if isinstance(route, Route):
            routes.append(Route(route.path, endpoint=KeyRequired(route.app, deps), methods=route.methods, name="mcp"))
    return routes
