"""Keyword index (BM25 in PostgreSQL) contract against a real embedded PostgreSQL."""

import math
import uuid
from collections import Counter

import asyncpg
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from serve_app.core.keywords import memory_keywords, normalize
from serve_app.core.records import MemoryRow
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores
from serve_app.stores.keyword_index import SCORE_DIGITS, KeywordIndex, int8_array, unpack_postings
from serve_app.stores.pg_pool import create_pool
from serve_app.stores.pg_schema import MIGRATIONS, migrate

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


async def test_coverage_is_the_share_of_the_query_weight_matched(keywords: KeywordIndex):
    user = "u-" + uuid.uuid4().hex[:6]
    docs = ["apple banana", "apple cherry cherry", "date"]
    await keywords.upsert([_row("t", user, "s", i + 1, d) for i, d in enumerate(docs)])
    hits = {h.text: h.coverage for h in await keywords.search("t", user, "appl cherri zucchini", limit=5)}

    def idf(df: int) -> float:
        return math.log(1 + (3 - df + 0.5) / (df + 0.5))

    whole = idf(2) + idf(1) + idf(0)  # "zucchini" is in no memory: it weighs most and matches nothing
    assert hits == {
        "apple cherry cherry": pytest.approx((idf(2) + idf(1)) / whole, rel=1e-9),
        "apple banana": pytest.approx(idf(2) / whole, rel=1e-9),
    }


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


async def test_memories_are_found_by_the_date_words_of_a_query(keywords: KeywordIndex):
    """A memory dated 8 May 2023 and one dated 7 July 2023, among undated chatter."""
    from datetime import date

    user = "u-" + uuid.uuid4().hex[:6]
    dated = {
        "We went to the beach.": date(2023, 5, 8),
        "We went to the museum.": date(2023, 7, 7),
    }
    rows = [
        MemoryRow(
            id=f"d{i}",
            tenant_id="t",
            user_id=user,
            session_id="s",
            seq=i,
            role="user",
            kind="turn",
            text=text,
            created_at_ms=0,
            vector=[0.0],
            keywords=memory_keywords(text, day=day),
        )  # fmt: skip
        for i, (text, day) in enumerate(dated.items())
    ]
    rows += [_row("t", user, "s2", i, f"We went to place number {i}.") for i in range(1, 20)]
    await keywords.upsert(rows)
    for query, expected in [
        ("Where did we go in May 2023?", "We went to the beach."),
        ("Where did we go on 8 May?", "We went to the beach."),
        ("where did we go on 7 July", "We went to the museum."),
        ("Where did we go July 7th?", "We went to the museum."),
    ]:
        hits = await keywords.search("t", user, normalize(query), limit=3)
        assert hits and hits[0].text == expected, (query, [h.text for h in hits])


async def test_memories_of_an_older_analysis_are_indexed_again_resumably(backends, embed):
    """Keyword text written by an older analysis (dates as "8 may 2023", no context kept) is indexed
    again from PostgreSQL alone: a chunk at a time, and the memorizer finishes the job at its start."""

    from serve_app.core.keywords import ANALYSIS_VERSION
    from serve_app.services.index_repair import reindex_keywords
    from serve_app.services.sweep import MemorizerSweep

    settings = Settings(**backends.env, milvus_collection="kw_reindex")
    stores = await Stores.connect(settings)
    user = "u-" + uuid.uuid4().hex[:6]
    said = ["Did you take Rex to the vet on Monday?", "Yes, I did.", "We went to the beach.", "Lovely weather."]
    old_day = "8 may 2023"  # what the first analysis wrote: "may" unstemmed, a stop word in every query
    rows = [
        MemoryRow(
            id=f"legacy-{i}",
            tenant_id="t",
            user_id=user,
            session_id="s-old",
            seq=i + 1,
            role="user",
            kind="turn",
            text=text,
            created_at_ms=1683504000000,
            vector=[0.0],
            keywords=" ".join([old_day, *([normalize(said[i - 1])] if i else []), normalize(text), normalize(text)]),
        )  # fmt: skip
        for i, text in enumerate(said)
    ]
    try:
        await stores.keywords.upsert(rows)
        await stores.keywords.pool.execute(  # as a memory written before migration 4 looks
            "UPDATE memory_keywords SET analysis = 1, context = NULL WHERE tenant_id = 't' AND user_id = $1", user
        )
        may = normalize("Where did we go in May 2023?")
        assert "We went to the beach." not in [h.text for h in await stores.keywords.search("t", user, may, limit=2)]

        assert await reindex_keywords(stores, settings, chunk=2, max_chunks=1) == 2  # stopped after one chunk
        stale = {m.row.id for m in await stores.keywords.stale(limit=1000)}
        assert {"legacy-2", "legacy-3"} <= stale and not {"legacy-0", "legacy-1"} & stale

        sweep = MemorizerSweep(stores, embed, settings)
        await sweep.sweep()  # the memorizer's first sweep resumes it
        await sweep.reindex
        assert not {m.row.id for m in await stores.keywords.stale(limit=1000)} & {r.id for r in rows}
        hits = await stores.keywords.search("t", user, may, limit=4)
        assert {h.text for h in hits} >= {"We went to the beach."}
        reply = await stores.keywords.search("t", user, normalize("vet visit"), limit=4)
        assert "Yes, I did." in [h.text for h in reply]  # its context was read from the turn before it
        versions = await stores.keywords.pool.fetch("SELECT DISTINCT analysis FROM memory_keywords WHERE user_id = $1", user)
        assert [r["analysis"] for r in versions] == [ANALYSIS_VERSION]
    finally:
        await stores.keywords.delete("t", user=user)
        await stores.close()


async def test_a_reply_indexed_with_a_whole_long_turn_before_it_is_indexed_again_with_its_end(backends):
    """Analysis 2 indexed a memory with every word of the turns before it; PostgreSQL kept those
    turns, so the re-index applies this analysis' rule (their ends) from them alone."""
    from serve_app.services.index_repair import reindex_keywords

    settings = Settings(**backends.env, milvus_collection="kw_reindex_tail")
    stores = await Stores.connect(settings)
    user = "u-" + uuid.uuid4().hex[:6]
    answer = "Kubernetes operators reconcile custom resources. " + "The garden wants water at dusk. " * 40
    answer += "Shall I book the dentist for Friday?"
    row = MemoryRow(
        "reply-1", "t", user, "s1", 2, "user", "turn", "Yes please.", 1000, [0.0],
        keywords=" ".join([normalize(answer), normalize("Yes please."), normalize("Yes please.")]), context=(answer,),
    )  # fmt: skip
    try:
        await stores.keywords.upsert([row])
        await stores.keywords.pool.execute("UPDATE memory_keywords SET analysis = 2 WHERE tenant_id = 't' AND user_id = $1", user)
        kubernetes = normalize("kubernetes operators")
        assert [h.id for h in await stores.keywords.search("t", user, kubernetes, limit=5)] == ["reply-1"]

        assert await reindex_keywords(stores, settings) == 1
        assert await stores.keywords.search("t", user, kubernetes, limit=5) == []
        assert [h.id for h in await stores.keywords.search("t", user, normalize("dentist Friday"), limit=5)] == ["reply-1"]
    finally:
        await stores.keywords.delete("t", user=user)
        await stores.close()


# BM25 by scanning every memory and posting of the user: the statement the kept statistics replace,
# kept here as the reference the fast one must equal.
_SEARCH_BY_SCAN = """
WITH stats AS (
    SELECT count(*)::float8 AS n, coalesce(avg(length), 1)::float8 AS avgdl
    FROM memory_keywords WHERE tenant_id = $1 AND user_id = $2
), postings AS (
    SELECT k.memory_id, p.tf::float8 AS tf, p.length::float8 AS length, count(*) OVER (PARTITION BY p.term)::float8 AS df
    FROM memory_postings p JOIN memory_keywords k ON k.tenant_id = p.tenant_id AND k.user_id = p.user_id AND k.doc = p.doc
    WHERE p.tenant_id = $1 AND p.user_id = $2 AND p.term = ANY($3::text[])
)
SELECT memory_id, sum(ln(1 + (s.n - p.df + 0.5) / (p.df + 0.5)) * p.tf * 2.2
                      / (p.tf + 1.2 * (0.25 + 0.75 * p.length / s.avgdl))) AS score
FROM postings p CROSS JOIN stats s GROUP BY memory_id ORDER BY score DESC, memory_id
"""


async def _stats_drift(keywords: KeywordIndex, tenant: str) -> list:
    """Rows where the kept statistics differ from a count over the index (empty when they agree)."""
    return await keywords.pool.fetch(
        """
        WITH counted AS (
            SELECT tenant_id, user_id, count(*) AS n, sum(length) AS total FROM memory_keywords
            WHERE tenant_id = $1 GROUP BY 1, 2
        ), terms AS (
            SELECT tenant_id, user_id, term, count(*) AS df FROM memory_postings WHERE tenant_id = $1 GROUP BY 1, 2, 3
        )
        SELECT 'user' AS kind, coalesce(c.user_id, s.user_id) AS user_id, NULL AS term
        FROM counted c FULL JOIN (SELECT * FROM memory_user_stats WHERE tenant_id = $1 AND n > 0) s
            USING (tenant_id, user_id)
        WHERE c.n IS DISTINCT FROM s.n OR c.total IS DISTINCT FROM s.total_length
        UNION ALL
        SELECT 'term', coalesce(t.user_id, s.user_id), coalesce(t.term, s.term)
        FROM terms t FULL JOIN (SELECT * FROM memory_term_stats WHERE tenant_id = $1) s USING (tenant_id, user_id, term)
        WHERE t.df IS DISTINCT FROM s.df
        """,
        tenant,
    )


async def test_kept_statistics_follow_every_write_and_search_equals_a_full_scan(keywords: KeywordIndex):
    tenant = "stats-" + uuid.uuid4().hex[:6]
    texts = [
        "Alice bought a red lamp in Oslo for 40 euros",
        "Bob repaired the lamp and the kettle on Monday",
        "The kettle from Oslo broke again, ticket KT-4411",
        "Alice and Bob painted the fence before the storm",
        "Remember the locker code 4417 for the gym in Oslo",
    ]
    rows = [_row(tenant, user, f"s-{user}", i + 1, t) for user in ("ann", "ben") for i, t in enumerate(texts)]
    await keywords.upsert(rows)
    await keywords.upsert(rows[:3])  # a retry replaces the same rows
    changed = _row(tenant, "ann", "s-ann", 2, "Bob repaired the kettle twice, then the lamp, then the kettle again")
    await keywords.upsert([changed])  # re-indexed with other terms and another length
    assert await _stats_drift(keywords, tenant) == []

    for query in ("lamp oslo", "kettle ticket repaired", "alice bob fence storm", "locker 4417 gym", "nothing here"):
        terms = list(dict.fromkeys(normalize(query).split()))
        fast = [(h.id, h.score) for h in await keywords.search(tenant, "ann", " ".join(terms), limit=50)]
        scanned = await keywords.pool.fetch(_SEARCH_BY_SCAN, tenant, "ann", terms)
        assert [i for i, _ in fast] == [r["memory_id"] for r in scanned]
        assert [s for _, s in fast] == pytest.approx([r["score"] for r in scanned], rel=1e-12)

    assert await keywords.delete(tenant, memory_id=rows[0].id, user="ann") == 1
    assert await keywords.delete(tenant, session="s-ben") == len(texts)  # every memory of ben
    assert await _stats_drift(keywords, tenant) == []
    # A forgotten user leaves no statistics behind: not even the words of their memories.
    assert await keywords.delete(tenant, user="ann") == len(texts) - 1
    left = await keywords.pool.fetchval(
        "SELECT (SELECT count(*) FROM memory_user_stats WHERE tenant_id = $1)"
        " + (SELECT count(*) FROM memory_term_stats WHERE tenant_id = $1)",
        tenant,
    )
    assert left == 0 and await keywords.search(tenant, "ann", "lamp", limit=5) == []


_WORDS = ["lamp", "oslo", "kettle", "ticket", "fence"]  # few, so that memories tie


@hyp_settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["write", "write", "write", "delete"]),
            st.integers(0, 11),
            st.lists(st.sampled_from(_WORDS), min_size=1, max_size=3),
        ),
        min_size=1,
        max_size=30,
    ),
    st.lists(st.sampled_from(_WORDS), min_size=1, max_size=3),
    st.integers(1, 8),
)
async def test_search_equals_the_statement_that_sums_in_postgresql_after_any_writes(keywords, steps, query, limit):
    """Memories numbered, re-indexed, deleted and numbered again in any order: the search that sums
    posting arrays finds what BM25 summed by PostgreSQL over the same index finds."""
    tenant, user = "numbered", "u-" + uuid.uuid4().hex[:6]
    for action, memory, words in steps:
        if action == "write":
            await keywords.upsert([_row(tenant, user, "s", memory, " ".join(words))])
        else:
            await keywords.delete(tenant, user=user, memory_id=f"s-{memory}")
    numbers = await keywords.pool.fetch("SELECT doc FROM memory_keywords WHERE tenant_id = $1 AND user_id = $2", tenant, user)
    assert len({r["doc"] for r in numbers}) == len(numbers)  # one number a memory
    terms = list(dict.fromkeys(normalize(" ".join(query)).split()))
    found = [(h.id, h.score) for h in await keywords.search(tenant, user, " ".join(terms), limit=limit)]
    summed = [(r["memory_id"], r["score"]) for r in await keywords.pool.fetch(_SEARCH_BY_SCAN, tenant, user, terms)]
    # Equal scores are ordered by id both ways; sums in another order differ in the last bits only.
    assert [i for i, _ in found] == [i for i, _ in _by_score_then_id(summed)][:limit]
    assert [s for _, s in found] == pytest.approx([s for _, s in _by_score_then_id(summed)][:limit], rel=1e-12)
    await keywords.delete(tenant, user=user)


def _by_score_then_id(scored: list[tuple[str, float]]) -> list[tuple[str, float]]:
    return sorted(scored, key=lambda p: (round(-p[1], SCORE_DIGITS), p[0]))


async def test_postings_arrive_packed_as_postgresql_sends_an_int8_array(keywords: KeywordIndex):
    sent = await keywords.pool.fetchval("SELECT array_send(ARRAY[0, 7, -3, 9223372036854775807]::int8[])")
    assert int8_array(sent).tolist() == [0, 7, -3, 9223372036854775807]
    assert int8_array(await keywords.pool.fetchval("SELECT array_send('{}'::int8[])")).tolist() == []
    assert int8_array(None).tolist() == []
    with pytest.raises(ValueError):
        int8_array(await keywords.pool.fetchval("SELECT array_send(ARRAY[1, NULL]::int8[])"))
    with pytest.raises(ValueError):
        int8_array(await keywords.pool.fetchval("SELECT array_send(ARRAY[1]::int4[])"))
    # The largest number, frequency and length a posting can hold come back as they went in.
    packed = await keywords.pool.fetchval(
        "SELECT array_send(ARRAY[(2147483647::int8 << 32) | (65535::int8 << 16) | 65535, (5::int8 << 32) | (1 << 16) | 9])"
    )
    postings = unpack_postings(1.5, int8_array(packed))
    assert postings.docs.tolist() == [2147483647, 5]
    assert postings.tfs.tolist() == [65535, 1] and postings.lengths.tolist() == [65535, 9]


async def test_an_index_written_before_memories_were_numbered_is_numbered_by_its_migration(backends):
    """A database at schema 10 (postings keyed by memory id) migrates to numbered memories: every
    posting kept under its memory's number, the statistics the same, search as before, and a new
    memory numbered after the others. A migration over a large index outlasts the pool's command
    timeout, which guards requests, not migrations."""
    name = "numbering_" + uuid.uuid4().hex[:8]
    admin = await asyncpg.connect(backends.env["POSTGRES_DSN"])
    await admin.execute(f"CREATE DATABASE {name}")
    dsn = backends.env["POSTGRES_DSN"].rsplit("/", 1)[0] + "/" + name
    pool = await create_pool(dsn)
    try:
        async with pool.acquire() as conn:
            await conn.execute(
                "CREATE TABLE schema_migrations (version INT PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            )
            for version, sql in MIGRATIONS[:10]:
                await conn.execute(sql)
                await conn.execute("INSERT INTO schema_migrations (version) VALUES ($1)", version)
            texts = {
                "ann": ["Alice bought a red lamp in Oslo", "The kettle from Oslo broke", "lamp lamp fence"],
                "ben": ["Oslo gym locker"],
            }
            for user, said in texts.items():
                for i, text in enumerate(said):
                    terms = Counter(normalize(text).split())
                    await conn.execute(
                        "INSERT INTO memory_keywords (tenant_id, user_id, memory_id, session_id, seq, role, kind, text,"
                        " created_at, length) VALUES ('t', $1, $2, 's', $3, 'user', 'turn', $4, 0, $5)",
                        user, f"m{9 - i}", i, text, sum(terms.values()),
                    )  # fmt: skip
                    await conn.executemany(
                        "INSERT INTO memory_postings (tenant_id, user_id, term, memory_id, tf, length)"
                        " VALUES ('t', $1, $2, $3, $4, $5)",
                        [(user, term, f"m{9 - i}", tf, sum(terms.values())) for term, tf in terms.items()],
                    )
            # A large user besides (300,000 postings), so that the migration takes seconds.
            await conn.execute(
                "INSERT INTO memory_keywords (tenant_id, user_id, memory_id, session_id, seq, role, kind, text, created_at,"
                " length) SELECT 'bulk', 'many', 'm' || i, 's', i, 'user', 'turn', 'words', 0, 10"
                " FROM generate_series(1, 30000) i"
            )
            await conn.execute(
                "INSERT INTO memory_postings (tenant_id, user_id, term, memory_id, tf, length)"
                " SELECT 'bulk', 'many', 'w' || (i % 1000 + j), 'm' || i, 1, 10"
                " FROM generate_series(1, 30000) i, generate_series(1, 10) j"
            )
        impatient = await asyncpg.create_pool(dsn, min_size=1, max_size=2, command_timeout=0.5)
        try:
            assert await migrate(impatient) == MIGRATIONS[-1][0]
        finally:
            await impatient.close()
        keywords = KeywordIndex(pool)
        assert await _stats_drift(keywords, "t") == []
        numbered = await pool.fetch("SELECT user_id, memory_id, doc FROM memory_keywords WHERE tenant_id = 't' ORDER BY 1, 2")
        assert [(r["user_id"], r["memory_id"], r["doc"]) for r in numbered] == [
            ("ann", "m7", 0), ("ann", "m8", 1), ("ann", "m9", 2), ("ben", "m9", 0),
        ]  # fmt: skip
        assert await pool.fetchval("SELECT count(*) FROM memory_postings WHERE tenant_id = 't'") == sum(
            len(set(normalize(t).split())) for said in texts.values() for t in said
        )
        terms = normalize("lamp Oslo").split()
        found = [(h.id, h.score) for h in await keywords.search("t", "ann", " ".join(terms), limit=10)]
        summed = [(r["memory_id"], r["score"]) for r in await pool.fetch(_SEARCH_BY_SCAN, "t", "ann", terms)]
        assert [i for i, _ in found] == [i for i, _ in summed] and len(found) == 3
        await keywords.upsert([_row("t", "ann", "s2", 1, "a second lamp for Oslo")])
        assert await pool.fetchval("SELECT doc FROM memory_keywords WHERE memory_id = 's2-1'") == 3
        assert await _stats_drift(keywords, "t") == []
    finally:
        await pool.close()
        await admin.execute(f"DROP DATABASE {name}")
        await admin.close()


async def test_postings_left_by_a_manual_delete_of_a_memory_row_find_nothing(keywords: KeywordIndex):
    """A memory row deleted by hand leaves its postings: a search skips them instead of failing."""
    tenant, user = "orphans", "u-" + uuid.uuid4().hex[:6]
    await keywords.upsert([_row(tenant, user, "s", 1, "a lamp in Oslo"), _row(tenant, user, "s", 2, "another lamp")])
    await keywords.pool.execute(
        "DELETE FROM memory_keywords WHERE tenant_id = $1 AND user_id = $2 AND memory_id = 's-1'", tenant, user
    )
    assert [h.id for h in await keywords.search(tenant, user, normalize("lamp Oslo"), limit=5)] == ["s-2"]
    await keywords.delete(tenant, user=user)
