"""A user's memory exported and imported into another tenant's user, on the real stores: the round
trip gives the same archive but for the ids derived from the owner, search answers the same, a
second import changes nothing, and an archive that does not fit is refused before anything is
written."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from serve_app.core.auth import Caller, hash_key
from serve_app.core.ids import renamed_session_id
from serve_app.core.user_archive import read_archive
from serve_app.errors import Conflict, InvalidRequest
from serve_app.schemas import AppendRequest, FactIn, MemoryIn, MessageIn, SearchRequest
from serve_app.services.memories import add_memory, search_memories
from serve_app.services.memorizer import SessionMemorizer
from serve_app.services.sessions import append_messages
from serve_app.services.user_archive import export_lines, import_archive
from serve_app.services.users import close_fact, put_fact
from tests.services.seed import new_id

START = datetime(2024, 5, 1, 8, 0, tzinfo=UTC)
PLANS = [
    "the greenhouse irrigation timer", "the sourdough starter feeding", "the marathon training block",
    "the attic insulation quote", "the violin lesson schedule", "the tax return paperwork", "the wedding seating chart",
    "the lake fishing trip",
]  # fmt: skip
QUESTIONS = ["When does the irrigation run?", "What did we decide about the violin lessons?", "Where is the fishing trip?"]


def _conversation() -> list[MessageIn]:
    turns = []
    for i, plan in enumerate(PLANS):
        asked = f"Let us settle {plan}. It has waited long enough."
        steps = " ".join(f"Step {n}: work on {plan} a little more, then check." for n in range(30))
        reply = f"For {plan}, here is a plan. {steps}"
        turns.append(MessageIn(role="user", content=asked, created_at=START + timedelta(hours=i)))
        turns.append(MessageIn(role="assistant", content=reply, created_at=START + timedelta(hours=i, minutes=5)))
    return turns


async def _export(deps, tenant: str, user: str):
    return read_archive([line async for line in export_lines(deps, tenant, user)])


def _comparable(archive):
    """The archive without what an import may change: owner-derived memory ids, the export's time."""
    memories = sorted((m.kind, m.role, m.text, m.session_id, m.seq, m.created_at) for m in archive.memories)
    return (
        [s.model_dump() for s in archive.sessions],
        {k: [m.model_dump() for m in v] for k, v in archive.messages.items()},
        memories,
        [f.model_dump() for f in archive.facts],
    )


async def test_a_round_trip_into_another_tenant_gives_the_same_archive_and_the_same_answers(make_deps, caller):
    deps = make_deps(compaction_trigger_tokens=64)
    user, session = new_id("user"), new_id("session")
    memorizer = SessionMemorizer(deps.stores, deps.embed_documents, deps.settings)
    rule = MessageIn(role="user", content="From now on, reply in French.", created_at=START + timedelta(days=1))
    await append_messages(deps, caller, session, AppendRequest(user_id=user, messages=[*_conversation(), rule]))
    await memorizer.memorize(caller.tenant, session)
    await add_memory(deps, caller.tenant, user, MemoryIn(text="Prefers tea to coffee in the morning.", created_at=START))
    await add_memory(deps, caller.tenant, user, MemoryIn(text="Owns a red bicycle.", id="bike-1", created_at=START))
    await put_fact(deps, caller.tenant, user, "city", FactIn(value="Oslo", category="fact"))
    await put_fact(deps, caller.tenant, user, "city", FactIn(value="Bergen", category="fact", source_session=session))
    await put_fact(deps, caller.tenant, user, "car", FactIn(value="none", category="fact"))
    await close_fact(deps, caller.tenant, user, "car")
    # A session whose log expired: its memories outlive it, and go into the archive as they are.
    gone = new_id("session")
    long_turn = "Notes on the boat. " + " ".join(f"The boat's engine part {n} needs oil every spring." for n in range(40))
    await append_messages(deps, caller, gone, AppendRequest(user_id=user, messages=[MessageIn(role="user", content=long_turn)]))
    await memorizer.memorize(caller.tenant, gone)
    await deps.stores.log.delete(caller.tenant, gone)

    original = await _export(deps, caller.tenant, user)
    kinds = {m.kind for m in original.memories}
    assert kinds == {"turn", "memory", "summary"} and any(".p" in m.id and m.session_id == gone for m in original.memories)
    assert len([f for f in original.facts if f.key == "city"]) == 2 and original.sessions[0].covers_upto_seq > 0
    said = [f for f in original.facts if f.category == "instruction"]
    assert [f.said_at for f in said] == [START + timedelta(days=1)]  # when it was said travels with it

    other = Caller(new_id("tenant"), hash_key(new_id("key")))
    target = new_id("user")
    report = await import_archive(deps, other.tenant, target, original)
    assert report.sessions == [session] and report.messages_added == len(PLANS) * 2 + 1 and report.facts_added == 4
    await memorizer.memorize(other.tenant, session)  # the imported log's turns, as the memorizer makes them

    imported = await _export(deps, other.tenant, target)
    assert _comparable(imported) == _comparable(original)
    assert {m.id for m in imported.memories}.isdisjoint({m.id for m in original.memories} - {"bike-1"})
    # The same hits in the same order: copied memories keep their vectors (an int8 vector depends a
    # little on the batch it was made in), and the memorizer makes the log's turns in the same batches.
    for question in QUESTIONS:
        asked = SearchRequest(query=question, top_k=10)
        before = [h.text for h in await search_memories(deps, caller.tenant, user, asked)]
        after = [h.text for h in await search_memories(deps, other.tenant, target, asked)]
        assert before and after == before

    again = await import_archive(deps, other.tenant, target, original)
    assert (again.messages_added, again.facts_added) == (0, 0)
    await memorizer.memorize(other.tenant, session)
    assert _comparable(await _export(deps, other.tenant, target)) == _comparable(original)


async def test_into_another_user_of_the_tenant_a_session_takes_an_id_of_its_own(make_deps, caller):
    deps = make_deps()
    user, session = new_id("user"), new_id("session")
    said = [MessageIn(role="user", content="The spare key is under the blue pot.", created_at=START)]
    await append_messages(deps, caller, session, AppendRequest(user_id=user, messages=said))
    archive = await _export(deps, caller.tenant, user)

    target = new_id("user")
    report = await import_archive(deps, caller.tenant, target, archive)
    renamed = renamed_session_id(session, target)
    assert report.renamed == {session: renamed} and report.sessions == [renamed] and report.messages_added == 1
    assert (await deps.stores.log.meta(caller.tenant, renamed)).user_id == target
    assert (await import_archive(deps, caller.tenant, target, archive)).messages_added == 0  # found again, not made twice


async def test_an_archive_that_does_not_fit_writes_nothing(make_deps, caller):
    deps = make_deps()
    user, session = new_id("user"), new_id("session")
    said = [MessageIn(role="user", content="The spare key is under the blue pot.", created_at=START)]
    await append_messages(deps, caller, session, AppendRequest(user_id=user, messages=said))
    await put_fact(deps, caller.tenant, user, "city", FactIn(value="Oslo", category="fact"))
    archive = await _export(deps, caller.tenant, user)

    # The target holds that session with other messages: refused before anything is written.
    target = new_id("user")
    other = [MessageIn(role="user", content="Something else entirely.", created_at=START)]
    await append_messages(deps, caller, renamed_session_id(session, target), AppendRequest(user_id=target, messages=other))
    with pytest.raises(Conflict, match="holds other messages"):
        await import_archive(deps, caller.tenant, target, archive)
    assert await deps.stores.facts.every_row(caller.tenant, target) == []

    # A message no append would take, checked before any write.
    archive.messages[session][0].message["role"] = "narrator"
    fresh = new_id("user")
    with pytest.raises(InvalidRequest, match=f"session {session}, seq 1: role"):
        await import_archive(deps, "tenant-fresh", fresh, archive)
    assert await deps.stores.facts.every_row("tenant-fresh", fresh) == []


async def test_memories_of_an_earlier_conversation_under_a_reused_session_id_travel_too(make_deps, caller):
    """The log an archive carries is the newest conversation under its id; memories of an older one
    (its log expired, the id used again) are not made again from that log, so they are copied."""
    deps = make_deps()
    user, session = new_id("user"), new_id("session")
    memorizer = SessionMemorizer(deps.stores, deps.embed_documents, deps.settings)
    old = [MessageIn(role="user", content="The old boiler was serviced in March.", created_at=START)]
    await append_messages(deps, caller, session, AppendRequest(user_id=user, messages=old))
    await memorizer.memorize(caller.tenant, session)
    await deps.stores.log.delete(caller.tenant, session)  # as if it expired
    new = [MessageIn(role="user", content="The new heat pump arrives in June.", created_at=START + timedelta(days=90))]
    await append_messages(deps, caller, session, AppendRequest(user_id=user, messages=new))
    await memorizer.memorize(caller.tenant, session)
    original = await _export(deps, caller.tenant, user)
    texts = sorted(m.text for m in original.memories)
    assert texts == ["The new heat pump arrives in June.", "The old boiler was serviced in March."]

    other, target = new_id("tenant"), new_id("user")
    report = await import_archive(deps, other, target, original)
    assert report.memories_written == 1  # the old conversation's turn; the new one's is the memorizer's
    await memorizer.memorize(other, session)
    assert _comparable(await _export(deps, other, target)) == _comparable(original)
