"""A session id used again after its log expired (or by another user) adds memories beside the old
ones: nothing memorized earlier is overwritten, and each memory stays with its own user."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from serve_app.services.memorizer import SessionMemorizer
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores

TENANT = "local"


@pytest.fixture
async def short_lived(backends):
    """Stores whose session logs expire one second after their last write."""
    settings = Settings(**backends.env, session_ttl_s=1, milvus_collection="reuse")
    stores = await Stores.connect(settings)
    yield stores, settings
    await stores.close()


FIRST_SEEN = "2024-05-01T10:00:00+00:00"


async def _say(stores: Stores, memorizer: SessionMemorizer, session: str, user: str, texts: list[str], when: str = FIRST_SEEN):
    turns = [{"role": "user", "content": t, "created_at": when} for t in texts]
    await stores.log.append(TENANT, session, user, turns)
    report = await memorizer.memorize(TENANT, session)
    assert report.embedded == len(texts)


async def _expire(stores: Stores, session: str) -> None:
    for _ in range(100):
        if await stores.log.meta(TENANT, session) is None:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the session log did not expire")


async def _texts(stores: Stores, user: str) -> set[str]:
    listed = {r["text"] for r in await stores.vectors.list(TENANT, user, limit=100)}
    indexed = {h.text for h in await stores.keywords.fetch(TENANT, user, await stores.keywords.memory_ids(TENANT, user))}
    assert listed == indexed, "Milvus and the keyword index disagree"
    return listed


async def test_a_reused_session_id_adds_beside_the_expired_sessions_memories(short_lived, embed):
    stores, settings = short_lived
    memorizer = SessionMemorizer(stores, embed, settings)
    session = "shared-" + uuid.uuid4().hex[:6]
    alice, bob = "alice-" + uuid.uuid4().hex[:6], "bob-" + uuid.uuid4().hex[:6]
    first = ["My cat is called Miso.", "I fly to Oslo on 3 May."]
    await _say(stores, memorizer, session, alice, first)
    await _expire(stores, session)

    again = ["I moved to Bergen last spring.", "My sister is a pilot."]
    await _say(stores, memorizer, session, alice, again)  # same id, same user, seqs start at 1 again
    await _expire(stores, session)

    bobs = ["I drive a red tractor.", "My dog is called Fido."]
    await _say(stores, memorizer, session, bob, bobs)  # same id, another user of the tenant

    assert await _texts(stores, alice) == set(first + again)
    assert await _texts(stores, bob) == set(bobs)
    hits = await stores.vectors.search_dense(TENANT, alice, (await embed(["what is the cat called?"]))[0], limit=1)
    assert hits[0].text == "My cat is called Miso."


async def test_turns_resent_after_expiry_are_not_memorized_twice(short_lived, embed):
    """A client that lost track of the expiry sends the same conversation again."""
    stores, settings = short_lived
    memorizer = SessionMemorizer(stores, embed, settings)
    session, user = "resent-" + uuid.uuid4().hex[:6], "carol-" + uuid.uuid4().hex[:6]
    turns = ["Book a table for two at 8 pm.", "Make it the Italian place on Rue Lepic."]
    await _say(stores, memorizer, session, user, turns)
    first = {r["id"]: r for r in await stores.vectors.list(TENANT, user, limit=100)}
    await _expire(stores, session)

    resend = [{"role": "user", "content": t, "created_at": "2024-06-01T10:00:00+00:00"} for t in turns]
    await stores.log.append(TENANT, session, user, resend)  # as the API stores them: created now
    await memorizer.memorize(TENANT, session)
    after = {r["id"]: r for r in await stores.vectors.list(TENANT, user, limit=100)}
    assert after.keys() == first.keys()
    assert [r["created_at"] for r in after.values()] == [r["created_at"] for r in first.values()]  # first sighting kept


async def test_a_session_deleted_and_made_again_while_memorized_keeps_none_of_the_old_log(short_lived, embed):
    """A delete's sweep runs while the memorizer embeds the old log; the same id is made again before
    the memorizer looks: the old log's memories go, the new session and its log stay."""
    stores, settings = short_lived
    session, user = "again-" + uuid.uuid4().hex[:6], "dora-" + uuid.uuid4().hex[:6]
    old, new = "My old locker code is 1234.", "The new session's first words."
    remade = asyncio.Event()

    async def embed_then_remake(texts: list[str], plain=None):
        vectors = await embed(texts, plain)
        if not remade.is_set() and old in texts:
            remade.set()
            await stores.log.delete(TENANT, session)  # the delete's sweep: the log and its memories
            await asyncio.sleep(0.01)  # a new created_at
            await stores.log.append(TENANT, session, user, [{"role": "user", "content": new}])
        return vectors

    await stores.log.append(TENANT, session, user, [{"role": "user", "content": old}])
    await SessionMemorizer(stores, embed_then_remake, settings).memorize(TENANT, session)
    assert remade.is_set()
    assert old not in await _texts(stores, user)  # the old log's memory was not left behind
    assert [t["content"] for t in await stores.log.read(TENANT, session)] == [new]  # the new session stays
