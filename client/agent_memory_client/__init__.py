"""Typed client of agent-memory-serve's HTTP API v1: `MemoryClient` (sync) and `AsyncMemoryClient`.

from agent_memory_client import MemoryClient

with MemoryClient("http://127.0.0.1:8000") as memory:
    memory.append("support-42", "alice", [{"role": "user", "content": "Ship ORD-4411 to my office."}])
    prompt = memory.context("alice", "support-42", "where should ORD-4411 go?", max_tokens=2048)
"""

from agent_memory_client import models
from agent_memory_client.client import (
    AsyncMemoryClient,
    Conflict,
    InvalidRequest,
    MemoryAPIError,
    MemoryClient,
    NotFound,
    RateLimited,
    Unauthorized,
    Unavailable,
)

__all__ = [
    "AsyncMemoryClient",
    "Conflict",
    "InvalidRequest",
    "MemoryAPIError",
    "MemoryClient",
    "NotFound",
    "RateLimited",
    "Unauthorized",
    "Unavailable",
    "models",
]
