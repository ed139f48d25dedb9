"""LangChain adapters (the `langchain` extra): a session as chat message history, memory search as
a retriever.

    history = MemoryChatHistory(MemoryClient(), session_id="support-42", user_id="alice")
    retriever = MemoryRetriever(client=MemoryClient(), user_id="alice", top_k=5)

Memory a team of agents shares: `spaces` names the memory spaces a retriever reads beside the
user's own memory, and `space` the one a history's turns are memorized into.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.retrievers import BaseRetriever

from agent_memory_client.client import AsyncMemoryClient, MemoryClient, NotFound
from agent_memory_client.models import SearchHit, StoredMessage

_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}


def to_stored(message: BaseMessage) -> dict[str, Any]:
    """A LangChain message as the API stores it."""
    role = _ROLES.get(message.type)
    if role is None:
        raise ValueError(f"messages of type {message.type!r} cannot be stored")
    turn: dict[str, Any] = {"role": role, "content": message.text if hasattr(message, "text") else str(message.content)}
    if isinstance(message, ToolMessage):
        turn["tool_call_id"] = message.tool_call_id
    if isinstance(message, AIMessage) and message.tool_calls:
        turn["tool_calls"] = [
            {"id": call.get("id"), "type": "function", "function": {"name": call["name"], "arguments": call["args"]}}
            for call in message.tool_calls
        ]
    return turn


def from_stored(message: StoredMessage) -> BaseMessage:
    if message.role == "user":
        return HumanMessage(message.content, id=message.id)
    if message.role == "system":
        return SystemMessage(message.content, id=message.id)
    if message.role == "tool":
        return ToolMessage(message.content, tool_call_id=message.tool_call_id or "", id=message.id)
    calls = [
        {"id": c.get("id"), "name": c["function"]["name"], "args": _args(c["function"].get("arguments"))}
        for c in message.tool_calls or []
    ]
    return AIMessage(message.content, tool_calls=calls, id=message.id)


def _args(arguments: Any) -> dict[str, Any]:
    import json

    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return {"arguments": arguments}
    return dict(arguments or {})


class MemoryChatHistory(BaseChatMessageHistory):
    """A session's log as LangChain chat history: appends go to the service (memorized there)."""

    def __init__(
        self, client: MemoryClient, session_id: str, user_id: str, *, space: str | None = None, agent_id: str | None = None
    ):
        self.client = client
        self.session_id = session_id
        self.user_id = user_id
        self.space = space
        self.agent_id = agent_id

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        try:
            return [from_stored(m) for m in self.client.iter_messages(self.session_id)]
        except NotFound:
            return []

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        if messages:
            turns = [to_stored(m) for m in messages]
            self.client.append(self.session_id, self.user_id, turns, agent_id=self.agent_id, space=self.space)

    def clear(self) -> None:
        try:
            self.client.delete_session(self.session_id)
        except NotFound:
            pass


def _document(hit: SearchHit) -> Document:
    return Document(
        page_content=hit.text,
        id=hit.id,
        metadata={
            "score": hit.score,
            "session_id": hit.session_id,
            "seq": hit.seq,
            "created_at": hit.created_at.isoformat(),
            "space": hit.space,
            "agent_id": hit.agent_id,
        },
    )


class MemoryRetriever(BaseRetriever):
    """A user's long-term memories, found by the service's hybrid search."""

    client: MemoryClient | None = None
    async_client: AsyncMemoryClient | None = None
    user_id: str
    top_k: int = 10
    min_score: float | None = None
    spaces: list[str] = []
    """Memory spaces searched beside the user's memories (each document's metadata names its space)."""

    model_config = {"arbitrary_types_allowed": True}

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        if self.client is None:
            raise ValueError("MemoryRetriever needs `client` for sync use")
        hits = self.client.search(self.user_id, query, self.top_k, self.min_score, spaces=self.spaces)
        return [_document(h) for h in hits]

    async def _aget_relevant_documents(self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun) -> list[Document]:
        if self.async_client is None:
            return await super()._aget_relevant_documents(query, run_manager=run_manager)
        hits = await self.async_client.search(self.user_id, query, self.top_k, self.min_score, spaces=self.spaces)
        return [_document(h) for h in hits]
