"""Keyword index (BM25 in PostgreSQL) contract against a real embedded PostgreSQL."""

import math
import uuid

import pytest

from serve_app.core.keywords import memory_keywords, normalize
from serve_app.core.records import MemoryRow
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores
from serve_app.stores.keyword_index import KeywordIndex

HOSTILE = ['x" or user_id != "', "q'\n\u00e9", "a\\", "' or 1=1 --", "\u202eevil", "%", "_"]


@pytest.fixture(scope="module")
async def keywords(backends):
    stores = await Stores.connect(Settings(**backends.env, milvus_collection="kw_" + uuid.uuid4().hex[:8]))
    yield stores.keywords
    await stores.close()


def _row(tenant: str, user: str, session: str, seq: int, text: str, before: list[str] | None = None) -> MemoryRow:
    return MemoryRow(
        f"{session}-{seq}", tenant, user, session, seq, "user", "turn", text, seq * 1000, [0.0],
        keywords=memory_keywords(text, before=before or []),
    )  # fmt: skip


async def test_bm25_ranks_rare_terms_and_uses_context(keywords: KeywordIndex):
    user = "u-" + uuid.uuid4().hex[:6]
    texts = ["We adopted a puppy named Rex last week!", "The weather is nice today.", "Yes, I did."]
    rows = [_row("t", user, "s1", i + 1, text) for i, text in enumerate(texts[:2])]
    rows.append(_row("t", user, "s1", 3, texts[2], before=["Did you take Rex to the vet?"]))
    assert await keywords.upsert(rows) == 3
    hits = await keywords.search("t", user, normalize("Who is the puppy that was adopted?"), limit=5)
    assert [h.text for h in hits] == [texts[0]]  # "adopted" meets "adopt" through the stemmer
    assert hits[0].score > 0 and hits[0].session_id == "s1" and hits[0].seq == 1
    reply = await keywords.search("t", user, normalize("vet visit"), limit=5)
    assert [h.text for h in reply] == ["Yes, I did."]  # found only through the turn before it
    assert await keywords.search("t", user, normalize("the and of"), limit=5) == []


async def test_score_is_bm25(keywords: KeywordIndex):
    user = "u-" + uuid.uuid4().hex[:6]
    docs = ["apple banana", "apple cherry cherry", "date"]
    await keywords.upsert([_row("t", user, "s", i + 1, d) for i, d in enumerate(docs)])
    hits = {h.text: h.score for h in await keywords.search("t", user, "cherri", limit=5)}
    # A memory's own terms count twice: lengths 4, 6, 2; "cherri" twice in the second, so tf 4.
    n, df, tf, length, avgdl = 3, 1, 4, 6, (4 + 6 + 2) / 3
    expected = math.log(1 + (n - df + 0.5) / (df + 0.5)) * tf * 2.2 / (tf + 1.2 * (1 - 0.75 + 0.75 * length / avgdl))
    assert hits == {"apple cherry cherry": pytest.approx(expected, rel=1e-9)}


async def test_retry_replaces_and_delete_scopes(keywords: KeywordIndex):
    user = "u-" + uuid.uuid4().hex[:6]
    rows = [_row("t", user, "s-a", i, f"zebra number {i}") for i in range(1, 4)] + [_row("t", user, "s-b", 1, "zebra too")]
    await keywords.upsert(rows)
    await keywords.upsert(rows)  # a retried memorization adds nothing
    assert len(await keywords.search("t", user, "zebra", limit=50)) == 4
    assert await keywords.delete("t", session="s-a") == 3
    assert [h.session_id for h in await keywords.search("t", user, "zebra", limit=50)] == ["s-b"]
    assert await keywords.delete("t", user=user) == 1
    assert await keywords.search("t", user, "zebra", limit=50) == []
    with pytest.raises(ValueError):
        await keywords.delete("t")


async def test_scoped_to_tenant_and_user(keywords: KeywordIndex):
    await keywords.upsert([_row("t1", "alice", "s-x", 1, "secret plans"), _row("t2", "alice", "s-y", 1, "secret other")])
    await keywords.upsert([_row("t1", "bob", "s-z", 1, "secret bob")])
    assert [h.text for h in await keywords.search("t1", "alice", "secret", limit=10)] == ["secret plans"]


@pytest.mark.parametrize("hostile", HOSTILE)
async def test_hostile_ids_and_terms_never_widen_a_query(keywords: KeywordIndex, hostile: str):
    await keywords.upsert([_row("t", "victim", "s-v", 1, "victim data")])
    assert await keywords.search("t", hostile, "victim data " + hostile, limit=50) == []
    assert await keywords.delete("t", user=hostile) == 0
    assert await keywords.delete("t", session=hostile) == 0
    assert [h.text for h in await keywords.search("t", "victim", "victim", limit=5)] == ["victim data"]
