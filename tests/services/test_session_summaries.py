"""A session's compacted turns remembered long-term as summary memories, on the real stores: dated,
one per block of turns whatever the compactions' spans, found by a question about the whole history
and gone with the session."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from serve_app.core.clock import iso_to_ms
from serve_app.core.ids import summary_memory_id
from serve_app.schemas import AppendRequest, ContextRequestIn, MessageIn, SearchRequest
from serve_app.services.context import build_working_memory
from serve_app.services.memories import search_memories
from serve_app.services.memorizer import SessionMemorizer
from serve_app.services.sessions import append_messages, delete_session
from tests.services.seed import new_id

TOPICS = [
    "the greenhouse irrigation timer", "the bakery's sourdough starter", "the marathon training plan",
    "the attic insulation quote", "the violin lesson schedule", "the tax return deadline", "the wedding seating chart",
    "the fishing trip to the lake", "the kitchen tile colours", "the chess club tournament", "the roof gutter repair",
    "the garden pond pump", "the piano tuning visit", "the bicycle chain replacement",
]  # fmt: skip
START = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)


def _turns(first: int, last: int) -> list[MessageIn]:
    """Turns at seqs first..last: a user's question and the reply, each about a topic of its own."""
    turns = []
    for seq in range(first, last + 1):
        topic = TOPICS[(seq - 1) // 2]
        content = (
            f"Let us plan {topic} this week. I have a few details to settle first." if seq % 2 else
            f"Here is how {topic} could go. Start with the basics and check back tomorrow with what you found."
        )  # fmt: skip
        turns.append(MessageIn(role="user" if seq % 2 else "assistant", content=content, created_at=START + timedelta(days=seq)))
    return turns


async def _summaries(deps, tenant: str, user: str, session: str, created_ms: int):
    ids = [summary_memory_id(tenant, user, session, created_ms, i) for i in range(6)]
    return sorted(await deps.stores.keywords.fetch(tenant, user, ids), key=lambda h: h.created_at_ms)


async def test_compacted_turns_are_remembered_in_blocks_recalled_for_the_whole_history_and_deleted_with_the_session(
    make_deps, caller
):
    deps = make_deps(compaction_trigger_tokens=64)
    tenant, user, session = caller.tenant, new_id("user"), new_id("session")
    memorizer = SessionMemorizer(deps.stores, deps.embed_documents, deps.settings)
    await append_messages(deps, caller, session, AppendRequest(user_id=user, messages=_turns(1, 22)))
    report = await memorizer.memorize(tenant, session)
    assert report.compaction is not None and report.compaction.covers_upto_seq == 18  # the newest two rounds stay
    created_ms = (await deps.stores.log.meta(tenant, session)).created_at_ms
    blocks = await _summaries(deps, tenant, user, session, created_ms)
    assert [h.kind for h in blocks] == ["summary"] * 3
    assert blocks[2].text.startswith("Summary of turns 17-18 of a session:")
    assert blocks[0].created_at_ms == iso_to_ms((START + timedelta(days=8)).isoformat())  # its last turn's date
    assert "user: Let us plan the greenhouse irrigation timer this week." in blocks[0].text

    # A later compaction starts inside the third block: it is written again whole, under its id.
    await append_messages(deps, caller, session, AppendRequest(user_id=user, messages=_turns(23, 28)))
    report = await memorizer.memorize(tenant, session)
    assert report.compaction.covers_upto_seq == 24
    again = await _summaries(deps, tenant, user, session, created_ms)
    assert len(again) == 3 and again[:2] == blocks[:2]
    assert again[2].text.startswith("Summary of turns 17-24 of a session:")
    assert "the kitchen tile colours" in again[2].text and "the garden pond pump" in again[2].text

    query = "Summarize what we planned over the weeks: the greenhouse irrigation, the sourdough starter and the marathon."
    hits = await search_memories(deps, tenant, user, SearchRequest(query=query, top_k=5))
    assert any(h.kind == "summary" for h in hits)
    other = new_id("session")
    await append_messages(deps, caller, other, AppendRequest(user_id=user, messages=[MessageIn(role="user", content=query)]))
    asked = ContextRequestIn(user_id=user, session_id=other, query=query, max_tokens=4096)
    prompt = (await build_working_memory(deps, tenant, asked)).messages[0]["content"]
    assert "- Summary of turns 1-8 of a session:\n  user: Let us plan the greenhouse irrigation timer" in prompt

    await delete_session(deps, tenant, session)
    assert await _summaries(deps, tenant, user, session, created_ms) == []


async def test_a_checkpoint_left_without_its_blocks_gets_them_on_the_next_pass(make_deps, caller):
    """A crash between a checkpoint and its summary memories (or the API's compaction, which does not
    wait for them) leaves the cursor behind; the next pass of the session writes them."""
    deps = make_deps(compaction_trigger_tokens=64)
    tenant, user, session = caller.tenant, new_id("user"), new_id("session")
    memorizer = SessionMemorizer(deps.stores, deps.embed_documents, deps.settings)
    await append_messages(deps, caller, session, AppendRequest(user_id=user, messages=_turns(1, 12)))
    outcome = await memorizer.compact(tenant, session, force=True)
    meta = await deps.stores.log.meta(tenant, session)
    assert outcome.compacted and meta.covers_upto_seq == 8 and meta.remembered_upto_seq == 0
    assert await _summaries(deps, tenant, user, session, meta.created_at_ms) == []

    report = await memorizer.memorize(tenant, session)
    assert report.summaries == 1 and (await deps.stores.log.meta(tenant, session)).remembered_upto_seq == 8
    (block,) = await _summaries(deps, tenant, user, session, meta.created_at_ms)
    assert block.text.startswith("Summary of turns 1-8 of a session:")
