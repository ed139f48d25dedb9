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


async def test_an_archive_larger_than_other_bodies_is_imported_up_to_its_own_limit(backends, embed):
    """A user's archive (memories with their vectors) outgrows `max_body_bytes` at a couple of
    thousand memories: an import has a limit of its own, `max_import_bytes`, and only it."""
    user, copy = f"big-{uuid.uuid4().hex[:8]}", f"copy-{uuid.uuid4().hex[:8]}"
    limits = {"max_body_bytes": LIMIT, "max_import_bytes": 64 * 1024}
    async with in_process_client(backends, embed=embed, **limits) as client:
        for n in range(3):
            note = {"text": f"Note {n}: the locker code is {n}417."}
            (await client.post(f"/v1/users/{user}/memories", json=note)).raise_for_status()
        archive = (await client.get(f"/v1/users/{user}/export")).content
        assert LIMIT < len(archive) < 64 * 1024
        headers = {"content-type": "application/x-ndjson"}
        imported = await client.post(f"/v1/users/{copy}/import", content=archive, headers=headers)
        assert imported.status_code == 200, imported.text
        assert imported.json()["memories_written"] == 3
        chunked = await client.post(f"/v1/users/{copy}/import", content=_chunked(archive, piece=512), headers=headers)
        assert chunked.status_code == 200, chunked.text
        over = await client.post(f"/v1/users/{copy}/import", content=archive * 30, headers=headers)
        assert over.status_code == 413 and "65536-byte limit" in over.json()["detail"]
        # Every other route keeps max_body_bytes.
        body = b'{"text": "' + b"x" * 4000 + b'"}'
        too_long = await client.post(f"/v1/users/{user}/memories", content=body, headers=headers)
        assert too_long.status_code == 413
