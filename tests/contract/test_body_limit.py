"""`max_body_bytes` holds for a body of any framing: one sent chunked, with no Content-Length, is
counted as it arrives and refused (413) once past the limit, before anything is stored."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

from tests.in_process import in_process_client

LIMIT = 2048


def _append(user: str, turns: int, size: int) -> bytes:
    messages = [{"role": "user", "content": "x" * size, "id": f"m{n}"} for n in range(turns)]
    return json.dumps({"user_id": user, "messages": messages}).encode()


async def _chunked(body: bytes, piece: int = 16 * 1024) -> AsyncIterator[bytes]:
    for start in range(0, len(body), piece):
        yield body[start : start + piece]


async def test_a_chunked_body_past_the_limit_gets_413_and_stores_nothing(backends):
    session = f"chunked-{uuid.uuid4().hex[:8]}"
    body = _append("alice", turns=16, size=60_000)
    async with in_process_client(backends, max_body_bytes=LIMIT) as client:
        response = await client.post(
            f"/v1/sessions/{session}/messages", content=_chunked(body), headers={"content-type": "application/json"}
        )
        assert "content-length" not in response.request.headers
        assert response.status_code == 413, response.text
        assert response.json()["detail"] == f"request body is over the {LIMIT}-byte limit"
        assert (await client.get(f"/v1/sessions/{session}")).status_code == 404


async def test_a_chunked_body_within_the_limit_is_served(backends):
    session = f"chunked-{uuid.uuid4().hex[:8]}"
    body = _append("alice", turns=2, size=100)
    async with in_process_client(backends, max_body_bytes=LIMIT) as client:
        response = await client.post(
            f"/v1/sessions/{session}/messages", content=_chunked(body, piece=64), headers={"content-type": "application/json"}
        )
    assert response.status_code == 200, response.text
    assert response.json()["seqs"] == [1, 2]
