"""The PostgreSQL schema of the service, as versioned migrations applied once under an advisory lock."""

from __future__ import annotations

import asyncpg

from serve_app.stores.pg_pool import session_lock

# Append-only list: a released migration is never edited, only followed by a new one.
MIGRATIONS: tuple[tuple[int, str], ...] = (
    (
        1,
        """
        CREATE TABLE facts (
            id           BIGSERIAL PRIMARY KEY,
            tenant_id    TEXT NOT NULL,
            user_id      TEXT NOT NULL,
            key          TEXT NOT NULL,
            value        TEXT NOT NULL,
            category     TEXT NOT NULL CHECK (category IN ('preference', 'fact', 'decision', 'task')),
            source_session TEXT,
            source_seqs  BIGINT[] NOT NULL DEFAULT '{}',
            valid_from   TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
            valid_to     TIMESTAMPTZ
        );
        CREATE UNIQUE INDEX facts_one_current ON facts (tenant_id, user_id, key) WHERE valid_to IS NULL;
        CREATE INDEX facts_history ON facts (tenant_id, user_id, key, valid_from);
        """,
    ),
    (
        2,
        """
        -- The keyword side of hybrid recall: one row per memory, one posting per (memory, term).
        CREATE TABLE memory_keywords (
            tenant_id   TEXT NOT NULL,
            user_id     TEXT NOT NULL,
            memory_id   TEXT NOT NULL,
            session_id  TEXT NOT NULL,
            seq         BIGINT NOT NULL,
            role        TEXT NOT NULL,
            kind        TEXT NOT NULL,
            text        TEXT NOT NULL,
            created_at  BIGINT NOT NULL,
            length      INT NOT NULL,
            PRIMARY KEY (tenant_id, user_id, memory_id)
        );
        CREATE INDEX memory_keywords_session ON memory_keywords (tenant_id, session_id);
        CREATE INDEX memory_keywords_length ON memory_keywords (tenant_id, user_id) INCLUDE (length);
        CREATE TABLE memory_postings (
            tenant_id   TEXT NOT NULL,
            user_id     TEXT NOT NULL,
            term        TEXT NOT NULL,
            memory_id   TEXT NOT NULL,
            tf          INT NOT NULL,
            length      INT NOT NULL,
            PRIMARY KEY (tenant_id, user_id, term, memory_id) INCLUDE (tf, length)
        );
        CREATE INDEX memory_postings_memory ON memory_postings (tenant_id, user_id, memory_id);
        """,
    ),
    (
        3,
        """
        -- Bulk-loaded postings must not wait for the default 10% growth before the planner learns
        -- their sizes: a plan made on empty-table estimates runs for seconds.
        ALTER TABLE memory_postings SET (autovacuum_analyze_scale_factor = 0.01, autovacuum_analyze_threshold = 1000);
        ALTER TABLE memory_keywords SET (autovacuum_analyze_scale_factor = 0.01, autovacuum_analyze_threshold = 200);
        """,
    ),
    (
        4,
        """
        -- The keyword analysis each memory was indexed with (core.keywords.ANALYSIS_VERSION), and the
        -- turns before it that its keyword text carries, so that a new analysis can index it again
        -- from PostgreSQL alone. Rows written before this migration: analysis 1, context unknown.
        ALTER TABLE memory_keywords ADD COLUMN analysis INT NOT NULL DEFAULT 1;
        ALTER TABLE memory_keywords ADD COLUMN context TEXT[];
        CREATE INDEX memory_keywords_analysis ON memory_keywords (analysis);
        """,
    ),
    (
        5,
        """
        -- Who deleted what, and when: every destructive call of the API (and so of the inspector).
        CREATE TABLE audit_log (
            id          BIGSERIAL PRIMARY KEY,
            tenant_id   TEXT NOT NULL,
            at          TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
            actor       TEXT NOT NULL,
            via         TEXT NOT NULL,
            action      TEXT NOT NULL,
            target      JSONB NOT NULL,
            result      JSONB NOT NULL DEFAULT '{}'
        );
        CREATE INDEX audit_log_tenant ON audit_log (tenant_id, id DESC);
        """,
    ),
    (
        6,
        """
        -- BM25's statistics kept as the index changes, so a search reads one row per user and one
        -- per query term instead of counting every memory and posting of the user. Kept by
        -- statement triggers, so every writer (this code, an older replica during an upgrade, a
        -- manual DELETE) keeps them right; each applies its deltas in key order, so two writers
        -- never lock the same rows in opposite orders.
        -- No write may land between the counts below and the triggers that keep them.
        LOCK TABLE memory_keywords, memory_postings IN SHARE ROW EXCLUSIVE MODE;
        CREATE TABLE memory_user_stats (
            tenant_id    TEXT NOT NULL,
            user_id      TEXT NOT NULL,
            n            BIGINT NOT NULL,
            total_length BIGINT NOT NULL,
            PRIMARY KEY (tenant_id, user_id)
        );
        CREATE TABLE memory_term_stats (
            tenant_id TEXT NOT NULL,
            user_id   TEXT NOT NULL,
            term      TEXT NOT NULL,
            df        BIGINT NOT NULL,
            PRIMARY KEY (tenant_id, user_id, term)
        );
        INSERT INTO memory_user_stats
            SELECT tenant_id, user_id, count(*), coalesce(sum(length), 0) FROM memory_keywords GROUP BY 1, 2;
        INSERT INTO memory_term_stats
            SELECT tenant_id, user_id, term, count(*) FROM memory_postings GROUP BY 1, 2, 3;

        -- One function per event (a statement trigger with transition tables has one event), each
        -- adding its deltas in key order.
        CREATE FUNCTION memory_user_stats_on_insert() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO memory_user_stats AS s (tenant_id, user_id, n, total_length)
            SELECT tenant_id, user_id, count(*), sum(length) FROM new_rows GROUP BY 1, 2 ORDER BY 1, 2
            ON CONFLICT (tenant_id, user_id) DO UPDATE
                SET n = s.n + EXCLUDED.n, total_length = s.total_length + EXCLUDED.total_length;
            RETURN NULL;
        END $$;
        CREATE FUNCTION memory_user_stats_on_update() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO memory_user_stats AS s (tenant_id, user_id, n, total_length)
            SELECT n.tenant_id, n.user_id, 0, sum(n.length - o.length)
            FROM new_rows n JOIN old_rows o USING (tenant_id, user_id, memory_id) GROUP BY 1, 2 ORDER BY 1, 2
            ON CONFLICT (tenant_id, user_id) DO UPDATE
                SET n = s.n + EXCLUDED.n, total_length = s.total_length + EXCLUDED.total_length;
            RETURN NULL;
        END $$;
        CREATE FUNCTION memory_user_stats_on_delete() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO memory_user_stats AS s (tenant_id, user_id, n, total_length)
            SELECT tenant_id, user_id, -count(*), -sum(length) FROM old_rows GROUP BY 1, 2 ORDER BY 1, 2
            ON CONFLICT (tenant_id, user_id) DO UPDATE
                SET n = s.n + EXCLUDED.n, total_length = s.total_length + EXCLUDED.total_length;
            -- A forgotten user leaves nothing behind (rows this statement has just locked).
            DELETE FROM memory_user_stats s USING (SELECT DISTINCT tenant_id, user_id FROM old_rows) d
            WHERE s.tenant_id = d.tenant_id AND s.user_id = d.user_id AND s.n <= 0;
            RETURN NULL;
        END $$;
        CREATE FUNCTION memory_term_stats_on_insert() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO memory_term_stats AS s (tenant_id, user_id, term, df)
            SELECT tenant_id, user_id, term, count(*) FROM new_rows GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
            ON CONFLICT (tenant_id, user_id, term) DO UPDATE SET df = s.df + EXCLUDED.df;
            RETURN NULL;
        END $$;
        CREATE FUNCTION memory_term_stats_on_delete() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO memory_term_stats AS s (tenant_id, user_id, term, df)
            SELECT tenant_id, user_id, term, -count(*) FROM old_rows GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
            ON CONFLICT (tenant_id, user_id, term) DO UPDATE SET df = s.df + EXCLUDED.df;
            -- A term no memory holds any more is not kept: its word would outlive a forget.
            DELETE FROM memory_term_stats s USING (SELECT DISTINCT tenant_id, user_id, term FROM old_rows) d
            WHERE s.tenant_id = d.tenant_id AND s.user_id = d.user_id AND s.term = d.term AND s.df <= 0;
            RETURN NULL;
        END $$;
        CREATE TRIGGER memory_user_stats_insert AFTER INSERT ON memory_keywords
            REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION memory_user_stats_on_insert();
        CREATE TRIGGER memory_user_stats_update AFTER UPDATE ON memory_keywords
            REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
            FOR EACH STATEMENT EXECUTE FUNCTION memory_user_stats_on_update();
        CREATE TRIGGER memory_user_stats_delete AFTER DELETE ON memory_keywords
            REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION memory_user_stats_on_delete();
        CREATE TRIGGER memory_term_stats_insert AFTER INSERT ON memory_postings
            REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION memory_term_stats_on_insert();
        CREATE TRIGGER memory_term_stats_delete AFTER DELETE ON memory_postings
            REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION memory_term_stats_on_delete();
        """,
    ),
    (
        7,
        """
        -- The document embedding each memory's vector was made with (encoding.DOCUMENT_EMBEDDING), so
        -- that a new one embeds older memories again from PostgreSQL alone. Rows written before this
        -- migration: embedding 1, the whole text alone.
        ALTER TABLE memory_keywords ADD COLUMN embedding INT NOT NULL DEFAULT 1;
        CREATE INDEX memory_keywords_embedding ON memory_keywords (embedding);
        """,
    ),
    (
        8,
        """
        -- The Milvus key scheme each memory's vector was written under (core.ids.VECTOR_KEYS), so that
        -- the vectors of an older scheme are moved to the current one from PostgreSQL's list. Rows
        -- written before this migration, or by a replica of older code: scheme 1, keyed by the
        -- memory id alone.
        ALTER TABLE memory_keywords ADD COLUMN vector_keys INT NOT NULL DEFAULT 1;
        CREATE INDEX memory_keywords_vector_keys ON memory_keywords (vector_keys);
        """,
    ),
    (
        9,
        """
        -- Standing instructions of the user are facts of their own category (core.standing).
        ALTER TABLE facts DROP CONSTRAINT facts_category_check;
        ALTER TABLE facts ADD CONSTRAINT facts_category_check
            CHECK (category IN ('preference', 'fact', 'decision', 'task', 'instruction'));
        """,
    ),
    (
        10,
        """
        -- Memory spaces (core.spaces): a tenant's shared memory, and each key's grant on it. A key is
        -- named as the audit log names it (core.auth.Caller.actor).
        CREATE TABLE spaces (
            tenant_id      TEXT NOT NULL,
            space_id       TEXT NOT NULL,
            quota_memories INT NOT NULL DEFAULT 0,
            created_by     TEXT NOT NULL,
            created_at     TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
            PRIMARY KEY (tenant_id, space_id)
        );
        CREATE TABLE space_grants (
            tenant_id  TEXT NOT NULL,
            space_id   TEXT NOT NULL,
            principal  TEXT NOT NULL,
            role       TEXT NOT NULL CHECK (role IN ('read', 'write', 'admin')),
            granted_by TEXT NOT NULL,
            granted_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
            PRIMARY KEY (tenant_id, space_id, principal),
            FOREIGN KEY (tenant_id, space_id) REFERENCES spaces ON DELETE CASCADE
        );
        CREATE INDEX space_grants_principal ON space_grants (tenant_id, principal);
        -- Provenance: the agent that wrote a memory or fact, the key that added it, and for a copy
        -- promoted into a space the user and memory it came from (forgetting that user finds it).
        ALTER TABLE memory_keywords ADD COLUMN agent_id TEXT, ADD COLUMN added_by TEXT,
            ADD COLUMN origin_user TEXT, ADD COLUMN origin_memory TEXT;
        CREATE INDEX memory_keywords_origin ON memory_keywords (tenant_id, origin_user) WHERE origin_user IS NOT NULL;
        ALTER TABLE facts ADD COLUMN agent_id TEXT, ADD COLUMN added_by TEXT, ADD COLUMN origin_user TEXT;
        CREATE INDEX facts_origin ON facts (tenant_id, origin_user) WHERE origin_user IS NOT NULL;
        """,
    ),
    (
        11,
        """
        -- Each memory numbered within its user (memory_keywords.doc), and its postings keyed by that
        -- number instead of its id: a search reads each query term's postings as arrays of numbers
        -- and sums them per memory outside PostgreSQL's executor (core.bm25), and an index entry is
        -- half the bytes. No writer may touch the index until the postings are copied.
        LOCK TABLE memory_keywords, memory_postings, memory_term_stats IN ACCESS EXCLUSIVE MODE;
        ALTER TABLE memory_keywords ADD COLUMN doc INT;
        UPDATE memory_keywords k SET doc = d.doc
        FROM (SELECT tenant_id, user_id, memory_id,
                     (row_number() OVER (PARTITION BY tenant_id, user_id ORDER BY memory_id) - 1)::int AS doc
              FROM memory_keywords) d
        WHERE k.tenant_id = d.tenant_id AND k.user_id = d.user_id AND k.memory_id = d.memory_id;
        ALTER TABLE memory_keywords ALTER COLUMN doc SET NOT NULL;
        CREATE UNIQUE INDEX memory_keywords_doc ON memory_keywords (tenant_id, user_id, doc);
        CREATE TABLE memory_postings_by_doc (
            tenant_id   TEXT NOT NULL,
            user_id     TEXT NOT NULL,
            term        TEXT NOT NULL,
            doc         INT NOT NULL,
            tf          INT NOT NULL,
            length      INT NOT NULL
        );
        INSERT INTO memory_postings_by_doc
            SELECT p.tenant_id, p.user_id, p.term, k.doc, p.tf, p.length
            FROM memory_postings p JOIN memory_keywords k USING (tenant_id, user_id, memory_id);
        DROP TABLE memory_postings;
        ALTER TABLE memory_postings_by_doc RENAME TO memory_postings;
        ALTER TABLE memory_postings ADD CONSTRAINT memory_postings_pkey
            PRIMARY KEY (tenant_id, user_id, term, doc) INCLUDE (tf, length);
        CREATE INDEX memory_postings_doc ON memory_postings (tenant_id, user_id, doc);
        -- Vacuumed as often as analyzed: a search reads postings by an index-only scan, which visits
        -- the table for every posting on a page the visibility map does not yet mark all-visible.
        ALTER TABLE memory_postings SET (
            autovacuum_analyze_scale_factor = 0.01, autovacuum_analyze_threshold = 1000,
            autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_insert_scale_factor = 0.01
        );
        -- Document frequencies counted again over what was copied (a posting without its memory's
        -- row, which no writer leaves, is not), then kept by the triggers of migration 6.
        DELETE FROM memory_term_stats;
        INSERT INTO memory_term_stats
            SELECT tenant_id, user_id, term, count(*) FROM memory_postings GROUP BY 1, 2, 3;
        CREATE TRIGGER memory_term_stats_insert AFTER INSERT ON memory_postings
            REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION memory_term_stats_on_insert();
        CREATE TRIGGER memory_term_stats_delete AFTER DELETE ON memory_postings
            REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION memory_term_stats_on_delete();
        """,
    ),
    (
        12,
        """
        -- When the user said what a fact holds (the turn's created_at), beside valid_from (when it was
        -- written): sessions are memorized in whatever order the memorizer reaches them, so a rule
        -- said later may be written first. Null for a fact nobody said (written through the API).
        ALTER TABLE facts ADD COLUMN said_at TIMESTAMPTZ;
        """,
    ),
)

_MIGRATION_LOCK = 0x6D656D73  # advisory lock id: replicas starting together migrate once
MIGRATION_TIMEOUT_S = 24 * 3600.0
"""A migration rewrites tables as large as the index: the pool's command timeout guards requests."""


async def migrate(pool: asyncpg.Pool) -> int:
    """Apply pending migrations in order, each in its own transaction; returns the schema version."""
    async with session_lock(pool, _MIGRATION_LOCK) as conn:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version INT PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        applied = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        for version, sql in MIGRATIONS:
            if version in applied:
                continue
            async with conn.transaction():
                await conn.execute(sql, timeout=MIGRATION_TIMEOUT_S)
                await conn.execute("INSERT INTO schema_migrations (version) VALUES ($1)", version)
        return max([v for v, _ in MIGRATIONS] + list(applied))
