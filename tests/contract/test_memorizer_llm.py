"""Memorizer with an LLM (scripted TEST DOUBLE) against the real stores: summaries, pinning,
fallback and redo, extraction with supersession and a cursor that never skips failed work."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from serve_app.services.compaction import Redo
from serve_app.services.memorizer import SessionMemorizer
from serve_app.services.sweep import MemorizerSweep
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores
from tests.doubles import ScriptedChatClient
from tests.lanes import BothLanes


def scripted_model(call) -> str:
    if call.response_format is not None:  # extraction
        convo = call.messages[1]["content"]
        facts = []
        for lang in ("Python", "Go"):
            if f"I now use {lang}" in convo or f"I use {lang}" in convo:
                facts = [{"key": "favorite_language", "value": lang, "category": "preference"}]
        return json.dumps({"facts": facts})
    # summarization: keeps the order id, drops the amount, so pinning has work to do
    return "The user asked about order ORD-31 and a refund."


@pytest.fixture
async def stores(backends, redis_settings):
    settings = Settings(**(backends.env | redis_settings), milvus_collection="memorizer_llm")
    connected = await Stores.connect(settings)
    yield connected
    await connected.close()


SETTINGS = Settings(compaction_trigger_tokens=64, compaction_keep_rounds=2, milvus_collection="memorizer_llm")


@pytest.fixture
def make(stores, embed):
    def memorizer(llm) -> BothLanes:
        return BothLanes(MemorizerSweep(stores, embed, SETTINGS, llm))

    return memorizer


async def _append(stores, session, user, texts):
    messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": t, "created_at": "2024-05-01T00:00:00+00:00"}
        for i, t in enumerate(texts)
    ]
    await stores.log.append("local", session, user, messages)


async def test_llm_summary_is_verified_and_pinned(stores, make):
    llm = ScriptedChatClient(scripted_model)
    session, user = "s-" + uuid.uuid4().hex[:8], "u-" + uuid.uuid4().hex[:6]
    await _append(
        stores,
        session,
        user,
        ["Where is ORD-31? I paid $45.20 on 2024-04-30."] + [f"filler turn {i} with words" for i in range(11)],
    )
    report = await make(llm).memorize("local", session)
    outcome = report.compaction
    assert outcome.compacted and outcome.summary.mode == "llm"
    assert "$45.20" in outcome.summary.pinned and "ORD-31" not in outcome.summary.pinned
    meta = await stores.log.meta("local", session)
    assert "ORD-31" in meta.summary and "$45.20" in meta.summary and "2024-04-30" in meta.summary
    assert not meta.summary_degraded
    assert llm.calls[0].temperature == 0.0


async def test_outage_falls_back_then_is_redone(stores, make):
    llm = ScriptedChatClient(scripted_model)
    llm.down = True
    memorizer = make(llm)
    session, user = "s-" + uuid.uuid4().hex[:8], "u-" + uuid.uuid4().hex[:6]
    await _append(stores, session, user, ["Order ORD-31 for $45.20"] + [f"more words in turn {i}" for i in range(11)])
    report = await memorizer.memorize("local", session)
    assert report.compaction.degraded and report.extraction_failed
    meta = await stores.log.meta("local", session)
    assert meta.summary_degraded and meta.covers_upto_seq > 0
    assert meta.memorized_upto_seq == 12 and meta.extracted_upto_seq == 0  # extraction cursor held back
    assert ("local", session) not in await stores.log.pending(limit=10_000)  # embedded: the LLM lane holds the rest
    assert ("local", session) in await stores.log.llm_pending(limit=10_000)  # until the LLM work is done

    llm.down = False
    report = await memorizer.memorize("local", session)
    assert report.redone is Redo.REDONE
    meta = await stores.log.meta("local", session)
    assert not meta.summary_degraded and "ORD-31" in meta.summary and "$45.20" in meta.summary
    assert meta.extracted_upto_seq == 12
    assert ("local", session) not in await stores.log.llm_pending(limit=10_000)


async def test_extraction_supersedes_facts_with_source_seqs(stores, make):
    llm = ScriptedChatClient(scripted_model)
    memorizer = make(llm)
    session, user = "s-" + uuid.uuid4().hex[:8], "u-" + uuid.uuid4().hex[:6]
    await _append(stores, session, user, ["I use Python at work."])
    await memorizer.memorize("local", session)
    await stores.log.append("local", session, user, [{"role": "user", "content": "Update: I now use Go for everything."}])
    await memorizer.memorize("local", session)
    current = await stores.facts.get("local", user, "favorite_language")
    history = await stores.facts.history("local", user, "favorite_language")
    assert current.value == "Go" and [h.value for h in history] == ["Python", "Go"]
    assert history[0].source_seqs == [1] and history[1].source_seqs == [2] and history[1].source_session == session
    assert "favorite_language: Python" in llm.calls[-1].messages[1]["content"]  # known facts are offered


async def test_invalid_extraction_output_is_retried_not_skipped(stores, make):
    answers = iter(["{not json", json.dumps({"facts": [{"key": "home_city", "value": "Lyon", "category": "fact"}]})])
    llm = ScriptedChatClient(lambda call: next(answers) if call.response_format else "summary")
    memorizer = make(llm)
    session, user = "s-" + uuid.uuid4().hex[:8], "u-" + uuid.uuid4().hex[:6]
    await _append(stores, session, user, ["I live in Lyon."])
    first = await memorizer.memorize("local", session)
    assert first.extraction_failed and (await stores.log.meta("local", session)).extracted_upto_seq == 0
    await memorizer.memorize("local", session)
    assert (await stores.facts.get("local", user, "home_city")).value == "Lyon"


async def test_concurrent_memorizers_do_the_work_once(stores, embed):
    """Three memorizers (replicas, or a poke racing the sweep) on one session: every turn embedded
    once, one extraction call, one fact row, not three of each."""
    embedded: list[str] = []

    async def counting_embed(texts: list[str], plain=None) -> list[list[float]]:
        embedded.extend(texts)
        return await embed(texts, plain)

    llm = ScriptedChatClient(scripted_model)
    session, user = "s-" + uuid.uuid4().hex[:8], "u-" + uuid.uuid4().hex[:6]
    await _append(stores, session, user, [f"turn {i} about ORD-{i}" for i in range(29)] + ["I use Python at work."])
    workers = [SessionMemorizer(stores, counting_embed, SETTINGS, llm) for _ in range(3)]
    embedding = await asyncio.gather(*(w.memorize("local", session) for w in workers))
    extraction = await asyncio.gather(*(w.catch_up_llm("local", session) for w in workers))
    # The turns, and the summary blocks of the turns the compaction folded (core/session_summaries.py).
    blocks = -(-(await stores.log.meta("local", session)).covers_upto_seq // SETTINGS.memory_summary_block_turns)
    assert blocks and await stores.vectors.count_session("local", session) == 30 + blocks
    turns = [t for t in embedded if not t.startswith("Summary of turn")]
    assert sorted(turns) == sorted({f"turn {i} about ORD-{i}" for i in range(29)} | {"I use Python at work."})
    assert len(embedded) - len(turns) == blocks
    assert [r.skipped for r in embedding].count(False) == 1 and [r.skipped for r in extraction].count(False) == 1
    assert len([c for c in llm.calls if c.response_format is not None]) == 1  # one extraction call
    assert [h.value for h in await stores.facts.history("local", user, "favorite_language")] == ["Python"]
    meta = await stores.log.meta("local", session)
    assert meta.memorized_upto_seq == 30 and meta.extracted_upto_seq == 30 and meta.message_count == 30


async def test_output_that_never_matches_the_schema_is_skipped_after_bounded_attempts(stores, make):
    llm = ScriptedChatClient(lambda call: '{"facts": "nonsense"}' if call.response_format else "summary")
    memorizer = make(llm)
    session, user = "s-" + uuid.uuid4().hex[:8], "u-" + uuid.uuid4().hex[:6]
    await _append(stores, session, user, ["I live in Lyon."])
    for attempt in range(1, 3):
        report = await memorizer.memorize("local", session)
        assert report.extraction_failed and (await stores.log.meta("local", session)).extracted_upto_seq == 0, attempt
    report = await memorizer.memorize("local", session)  # third invalid answer: counted and skipped
    assert report.extraction_rejects == 1 and not report.extraction_failed
    assert (await stores.log.meta("local", session)).extracted_upto_seq == 1
    assert ("local", session) not in await stores.log.llm_pending(limit=10_000)


async def test_a_tombstone_that_lands_while_the_memorizer_embeds_leaves_nothing(stores, embed):
    """DELETE /v1/users/{id} runs while the memorizer embeds the user's turns (driven by events):
    what it writes afterwards is erased, and no LLM work follows."""
    from serve_app.services.users import forget_user

    llm = ScriptedChatClient(scripted_model)
    session, user = "s-" + uuid.uuid4().hex[:8], "u-" + uuid.uuid4().hex[:6]
    await _append(stores, session, user, ["I use Python at work.", "My locker code is 4417."])
    embedding, forgotten = asyncio.Event(), asyncio.Event()

    async def slow_embed(texts: list[str], plain=None) -> list[list[float]]:
        embedding.set()
        await forgotten.wait()
        return await embed(texts, plain)

    memorizing = asyncio.create_task(BothLanes(MemorizerSweep(stores, slow_embed, SETTINGS, llm)).memorize("local", session))
    await asyncio.wait_for(embedding.wait(), 60)
    await forget_user(stores, "local", user)
    forgotten.set()
    report = await memorizing
    assert await stores.vectors.count_session("local", session) == 0
    assert await stores.keywords.memory_ids("local", user) == []
    assert await stores.log.meta("local", session) is None
    assert report.cursor == -1
    assert await stores.facts.current("local", user) == []
    assert llm.calls == []


async def test_a_forget_that_lands_between_the_check_and_the_fact_write_leaves_no_fact(stores, make):
    """The race itself, driven by events: extraction has checked the tombstone and is about to write
    its facts when DELETE /v1/users/{id} runs; afterwards no fact of the user may remain."""
    from serve_app.services.users import forget_user

    llm = ScriptedChatClient(scripted_model)
    session, user = "s-" + uuid.uuid4().hex[:8], "u-" + uuid.uuid4().hex[:6]
    await _append(stores, session, user, ["I use Python at work."])
    about_to_write, forgotten = asyncio.Event(), asyncio.Event()
    real_put = stores.facts.put

    async def put_after_the_forget(*args, **kwargs):
        about_to_write.set()
        await forgotten.wait()
        return await real_put(*args, **kwargs)

    stores.facts.put = put_after_the_forget
    try:
        memorizing = asyncio.create_task(make(llm).memorize("local", session))
        await asyncio.wait_for(about_to_write.wait(), 60)
        await forget_user(stores, "local", user)
        forgotten.set()
        (outcome,) = await asyncio.gather(memorizing, return_exceptions=True)
    finally:
        stores.facts.put = real_put
    assert await stores.facts.current("local", user) == []
    assert await stores.facts.history("local", user, "favorite_language") == []
    assert not isinstance(outcome, Exception), outcome  # a forgotten session ends the pass quietly


async def test_a_session_begun_before_a_forget_is_erased_when_the_memorizer_reaches_it(stores, make):
    """The forget did not see the session (it was not yet in the user's index); the memorizer comes
    to it after the tombstone and erases it instead of memorizing it."""
    llm = ScriptedChatClient(scripted_model)
    session, user = "s-" + uuid.uuid4().hex[:8], "u-" + uuid.uuid4().hex[:6]
    await _append(stores, session, user, ["I use Python at work."])
    await stores.log.set_tombstone("local", user)
    report = await make(llm).memorize("local", session)
    assert report.cursor == -1
    assert await stores.log.meta("local", session) is None
    assert await stores.vectors.count_session("local", session) == 0
    assert await stores.facts.get("local", user, "favorite_language") is None
    assert llm.calls == []
