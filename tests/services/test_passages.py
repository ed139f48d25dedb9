"""Long turns on the real stores: stored whole in the session log, remembered as passages, found by
a sentence from their middle and quoted in a prompt as the passage that matters."""

from __future__ import annotations

from serve_app.core.keywords import normalize
from serve_app.schemas import AppendRequest, ContextRequestIn, MessageIn, SearchRequest
from serve_app.services.context import build_working_memory
from serve_app.services.memories import search_memories
from serve_app.services.memorizer import SessionMemorizer
from serve_app.services.sessions import append_messages, read_page
from tests.services.seed import new_id

TOPICS = (
    (
        "the database migration",
        "We move the orders table to the new cluster over two weekends and keep the old replica for rollback.",
    ),
    (
        "the hiring plan",
        "Two backend engineers join in March; the interview loop has a system design round and a pairing session.",
    ),
    (
        "the greenhouse irrigation",
        "The drip lines in the greenhouse run at dawn for twelve minutes, fed by the rain barrel behind the shed.",
    ),
    ("the launch checklist", "Before launch we freeze the schema, rehearse the rollback and write the status page announcement."),
    ("the quarterly budget", "Cloud spend is capped at forty thousand a quarter, with the GPU reservation renegotiated in June."),
    ("the support rota", "Support rotates weekly between four people, handing over on Monday at nine with the open tickets."),
)


def _long_turn() -> str:
    """About 4,000 characters in six paragraphs, each on a subject of its own."""
    return "\n\n".join(f"On {topic}: {detail} " + f"More about {topic} follows in the notes. " * 8 for topic, detail in TOPICS)


async def test_a_message_of_any_length_the_body_holds_is_stored_whole(deps, caller):
    session, user = new_id("session"), new_id("user")
    pasted = "".join(f"line {i}: a pasted build log of the nightly job, step {i} passed\n" for i in range(4000))
    assert len(pasted.encode()) > 200_000
    await append_messages(deps, caller, session, AppendRequest(user_id=user, messages=[MessageIn(role="user", content=pasted)]))
    page = await read_page(deps, caller.tenant, session, after=0, limit=10)
    assert [m.content for m in page.messages] == [pasted]


async def test_a_long_turn_is_found_by_a_sentence_from_its_middle_and_quoted_as_that_passage(deps, caller):
    tenant, user, session = caller.tenant, new_id("user"), new_id("session")
    turn = _long_turn()
    said = [
        MessageIn(role="user", content="Can you write up where every project stands?"),
        MessageIn(role="assistant", content=turn),
    ]
    await append_messages(deps, caller, session, AppendRequest(user_id=user, messages=said))
    report = await SessionMemorizer(deps.stores, deps.embed_documents, deps.settings).memorize(tenant, session)
    assert report.embedded > 2  # the question and the turn's passages

    query = "How long do the drip lines in the greenhouse run each morning?"
    hits = await search_memories(deps, tenant, user, SearchRequest(query=query, top_k=5))
    best = hits[0]
    assert "drip lines in the greenhouse" in best.text and best.parts is not None and 1 < best.part < best.parts
    assert len(best.text) < len(turn) // 3 and best.text in turn

    other_session = new_id("session")
    await append_messages(
        deps, caller, other_session, AppendRequest(user_id=user, messages=[MessageIn(role="user", content=query)])
    )
    built = await build_working_memory(
        deps, tenant, ContextRequestIn(user_id=user, session_id=other_session, query=query, max_tokens=2048)
    )
    system = built.messages[0]["content"]
    assert "assistant: … On the greenhouse irrigation: The drip lines" in system
    assert system.count("The drip lines in the greenhouse") == 1  # a passage is quoted once
    assert "On the database migration" not in system  # the turn's other subjects stay out


async def test_a_reply_after_a_long_turn_is_indexed_with_the_end_of_it_not_all_of_it(deps, caller):
    """A short reply's keywords carry what it answers, the long turn's end; the long turn's start
    would make every question about that start find the reply too, and BM25 score it as long."""
    tenant, user, session = caller.tenant, new_id("user"), new_id("session")
    reply = "Monday at nine works for me."
    said = [
        MessageIn(role="user", content="Can you write up where every project stands?"),
        MessageIn(role="assistant", content=_long_turn() + "\n\nShall the support handover stay on Monday at nine?"),
        MessageIn(role="user", content=reply),
    ]
    await append_messages(deps, caller, session, AppendRequest(user_id=user, messages=said))
    await SessionMemorizer(deps.stores, deps.embed_documents, deps.settings).memorize(tenant, session)

    async def keyword_hits(words: str) -> list[str]:
        return [h.text for h in await deps.stores.keywords.search(tenant, user, normalize(words), limit=20)]

    assert reply not in await keyword_hits("orders table cluster replica rollback")  # the long turn's first subject
    assert reply in await keyword_hits("support handover")  # what the reply answers
