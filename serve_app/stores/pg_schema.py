"""The PostgreSQL schema of the service, as versioned migrations applied once under an advisory lock."""

from __future__ import annotations

import asyncpg

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
)

_MIGRATION_LOCK = 0x6D656D73  # advisory lock id: replicas starting together migrate once


async def migrate(pool: asyncpg.Pool) -> int:
    """Apply pending migrations in order, each in its own transaction; returns the schema version."""
    async with pool.acquire() as conn:
        await conn.execute("SELECT pg_advisory_lock($1)", _MIGRATION_LOCK)
        try:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version INT PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            )
            applied = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
            for version, sql in MIGRATIONS:
                if version in applied:
                    continue
                async with conn.transaction():
                    await conn.execute(sql)
                    await conn.execute("INSERT INTO schema_migrations (version) VALUES ($1)", version)
            return max([v for v, _ in MIGRATIONS] + list(applied))
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", _MIGRATION_LOCK)
