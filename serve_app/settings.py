"""Service configuration: one pydantic-settings model read from the environment or Serve `args`.

The same code runs embedded and in production; only these values change.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Literal

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from serve_app.core.budget import BudgetShares
from serve_app.core.keywords import CONTEXT_CHARS


class Settings(BaseSettings):
    """All knobs with their defaults. Env: `MEMSERVE_<NAME>`, plus REDIS_URL, POSTGRES_DSN, MILVUS_URI."""

    model_config = SettingsConfigDict(env_prefix="MEMSERVE_", extra="forbid", populate_by_name=True)

    redis_url: str = Field(
        "redis://127.0.0.1:16379/0",
        validation_alias=AliasChoices("redis_url", "REDIS_URL", "MEMSERVE_REDIS_URL"),
        description="Redis of the session logs, summary checkpoints, cursors, the memorizer's lanes and rate limits; "
        "with redis_cluster, any one node of the cluster.",
    )
    redis_cluster: bool = Field(
        False,
        description="redis_url names one node of a Redis Cluster: the client discovers the others and routes by slot "
        "(redis-py has no URL scheme for cluster mode).",
    )
    redis_sentinel_master: str = Field(
        "",
        description="Name of the primary a set of Redis Sentinels watches: redis_url then names the Sentinels, "
        "redis://[:password@]host:port[,host:port...]/db (password and db are the primary's).",
    )
    redis_confirm_replicas: int = Field(
        0,
        ge=0,
        description="Replicas that must confirm a session-log write (WAITAOF on Redis 7.2+, WAIT before) before it is "
        "acknowledged: appends, checkpoints, cursors, deletes, tombstones. Replication is asynchronous, so without it "
        "a failover to a lagging replica loses acknowledged turns. 0 for a Redis without replicas (embedded); the "
        "service refuses to start when a primary has fewer replicas connected. WAITAOF counts replicas with "
        "appendonly yes only.",
    )
    redis_confirm_timeout_ms: int = Field(
        1000,
        ge=1,
        description="How long a write waits for redis_confirm_replicas; past it the request gets 503 with Retry-After "
        "(the write may be stored: a retry with the same client message ids stores each turn once).",
    )
    postgres_dsn: str = Field(
        "postgresql://postgres@127.0.0.1:15432/postgres",
        validation_alias=AliasChoices("postgres_dsn", "POSTGRES_DSN", "MEMSERVE_POSTGRES_DSN"),
        description="PostgreSQL of the facts, the record of every long-term memory, the keyword index and the audit "
        "log (migrations applied on start).",
    )
    milvus_uri: str = Field(
        "http://127.0.0.1:19530",
        validation_alias=AliasChoices("milvus_uri", "MILVUS_URI", "MEMSERVE_MILVUS_URI"),
        description="Milvus of the memories' vectors (an index repaired from PostgreSQL).",
    )
    milvus_token: str = Field("", description="Milvus credentials (`user:password` or an API key); empty: none. Masked in logs.")
    milvus_collection: str = Field("memories_v2", description="v2: dense + BM25 keyword fields, partitioned by user hash.")
    milvus_partitions: int = Field(
        64, ge=1, le=1000, description="Partitions a new collection gets; a user's searches touch only theirs."
    )
    milvus_flush_interval_s: float = Field(
        2.0, ge=0, description="Memorizer flushes new vectors this often (Milvus Lite searches unflushed rows slowly); 0 = off."
    )

    default_tenant: str = Field("local", description="Tenant of every request when API keys are off.")
    api_keys: dict[str, str] = Field(
        default_factory=dict,
        description="SHA-256 hex of each API key -> its tenant, or '<tenant>:admin' for its admin (`memserve hash-key`).",
    )
    api_keys_file: str = Field("", description="File of '<tenant>:<sha256 hex>[:admin]' lines, e.g. a mounted Secret.")
    require_api_keys: bool = Field(False, description="Refuse to start without keys (any non-loopback deployment).")
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="With API keys off, the host names a request may address besides loopback ones (127.0.0.1, "
        "localhost, ::1), in Host and a browser's Origin: any other name gets 421, so a page whose name an attacker "
        "re-resolves to this machine (DNS rebinding) reaches nothing. Names only, no ports. Not checked with keys on.",
    )
    rate_limit_messages_per_minute: int = Field(0, ge=0, description="Appended messages per API key and minute; 0 = unlimited.")
    rate_limit_overrides: dict[str, int] = Field(default_factory=dict, description="Per-tenant messages per minute.")
    quota_memories: int = Field(
        0, ge=0, description="Stored long-term memories per tenant; appends and memory writes past it get 429. 0 = unlimited."
    )
    quota_overrides: dict[str, int] = Field(default_factory=dict, description="Per-tenant stored-memory quotas.")
    space_quota_memories: int = Field(
        0, ge=0, description="Memories a new memory space may hold unless its creator sets another (0 = the tenant's quota only)."
    )
    forget_promoted: Literal["delete", "pseudonymise"] = Field(
        "delete",
        description="Forgetting a user removes the copies promoted from the user's memory into spaces (delete), or keeps "
        "them with the user's id in their provenance replaced by a pseudonym (pseudonymise).",
    )
    ui_secret: SecretStr = Field(
        SecretStr(""),
        description="Signs the inspector's session cookies; every Ingress replica needs the same one (memserve up keeps "
        "one in its data dir). Empty: with API keys on, the inspector refuses sign-in; with keys off, each replica "
        "makes its own.",
    )
    ui_session_max_age_s: int = Field(12 * 3600, ge=60, description="How long an inspector sign-in lasts.")
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="Larger request bodies get 413 before parsing.")
    max_import_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024,
        description="The largest archive `POST /v1/users/{uid}/import` takes (its own limit: an archive with vectors "
        "outgrows max_body_bytes at a couple of thousand memories; it is read whole before anything is written).",
    )
    session_ttl_s: int = Field(7 * 24 * 3600, gt=0, description="Session log TTL from the last write.")

    default_max_tokens: int = Field(8192, ge=256, description="Context budget of a /v1/context request that gives no max_tokens.")
    shares: BudgetShares = Field(
        BudgetShares(),
        description="Each section's claim on max_tokens (memory, history, tools, output); what is left flows to memory, "
        "then to history. A request's shares override them.",
    )
    context_standing_share: float = Field(
        0.25,
        ge=0,
        le=1,
        description="The most of the memory section's grant that the user's standing instructions and preferences "
        "take, in a section of their own, before the facts: the rest is left to what answers the query "
        "(docs/architecture/memorizer.md).",
    )

    compaction_trigger_tokens: int = Field(
        4000, ge=64, description="Unsummarized history above this is compacted by the memorizer."
    )
    compaction_keep_rounds: int = Field(2, ge=2, description="Newest rounds never compacted.")
    summary_max_tokens: int = Field(512, ge=64, description="Cap on the gist part of the extractive summary.")

    embedding_model: str = Field("", description="Path of a sentence-transformers model; empty = the bundled all-MiniLM-L6-v2.")
    embedding_dim: int = Field(384, description="Dimension of the embedding model's vectors (the collection's vector field).")
    embedding_int8: bool = Field(
        True,
        description="Dynamic int8 quantization of the model's Linear layers: faster on CPU for about the same recall "
        "(docs/benchmarks/components.md). Applies to documents and queries alike; changing it on a filled store mixes "
        "the two kinds of vectors.",
    )
    embedder_max_batch_size: int = Field(
        32,
        ge=1,
        le=32,
        description="Concurrent callers' texts encoded in one batch; at most 32, so that the Embedder's two batches "
        "at once fit its max_ongoing_requests (64).",
    )
    embedder_batch_wait_s: float = Field(
        0.01,
        ge=0,
        description="How long a batch of concurrent single texts waits to fill (bench/embedder_batching.py); queries "
        "skip it when query_embedding is local.",
    )

    recall_top_k: int = Field(
        50,
        ge=0,
        le=100,
        description="The most memories a context takes (a request's top_k overrides): below it the floors and the room "
        "decide how many.",
    )
    recall_min_score: float = Field(
        0.3,
        ge=-1,
        le=1,
        description="Dense floor: cosine a memory needs on meaning alone (docs/benchmarks/beam.md says why 0.3).",
    )
    context_min_probability: float = Field(
        0.001,
        ge=0,
        le=1,
        description="A context leaves out a memory the second stage (`recall_rerank`) gives less than this chance of "
        "answering the query: a line in the prompt costs its tokens whatever it is worth (bench.probability_floor). "
        "Search returns them, ranked; 0 = no floor; no effect with the second stage off.",
    )
    recall_min_keyword_share: float = Field(
        0.3, ge=0, le=1, description="Keyword floor: share of the query's best BM25 score a memory needs on words alone."
    )
    recall_min_keyword_coverage: float = Field(
        0.3,
        ge=0,
        le=1,
        description="Absolute keyword floor: share of the query's idf weight a memory must match on words alone, so a "
        "query that shares only a word or two with every memory recalls none of them.",
    )
    recall_related_similarity: float = Field(
        0.45,
        ge=0,
        le=2,
        description="A query whose nearest memory has at least this cosine is about the user's memories: the "
        "coverage floor is not applied to it, and its weaker keyword matches are ranked by the second stage instead "
        "of dropped (docs/benchmarks/beam.md); above 1: the coverage floor applies to every query.",
    )
    recall_hybrid: bool = Field(True, description="Fuse BM25 keyword matches with dense similarity (off = dense only).")
    recall_rerank: bool = Field(
        True,
        description="Order the fused candidates by the second-stage model (core/rerank.py: scores, coverage, length, "
        "session) before the cut to top_k; off = the fusion's order. The score returned is then its probability.",
    )
    recall_rerank_model: str = Field(
        "",
        description="JSON file of second-stage models fitted on your own conversations (`python -m bench.rerank_fit "
        "DATA --model-out FILE`); empty: the shipped pair, fitted on LoCoMo and long development conversations.",
    )
    recall_candidates: int = Field(
        100,
        ge=1,
        le=500,
        description="Candidates taken from each side before fusion: a long turn is several passages, so the lists "
        "hold fewer distinct turns than rows (docs/benchmarks/beam.md).",
    )
    recall_dense_weight: float = Field(0.5, ge=0, description="Weight of the dense (vector) ranking in reciprocal-rank fusion.")
    recall_keyword_weight: float = Field(1.0, ge=0, description="Weight of the keyword (BM25) ranking in reciprocal-rank fusion.")
    recall_time_weight: float = Field(0.5, ge=0, description="Boost for memories from the time a query names.")
    recall_rrf_k: float = Field(20.0, gt=0, description="Reciprocal-rank fusion constant: lower favours the top ranks.")
    recall_keyword_context_turns: int = Field(
        2, ge=0, le=8, description="Turns before a memory indexed with its keywords (a reply is found through its question)."
    )
    recall_keyword_context_chars: int = Field(
        CONTEXT_CHARS,
        ge=1,
        description="Characters of each turn before a memory that its keywords carry, from that turn's end: a reply "
        "is found through what it answers, not through every word of a long answer before it.",
    )
    recall_keyword_self_weight: int = Field(2, ge=1, le=4, description="Times a memory's own words count in its keyword text.")
    memory_whole_chars: int = Field(
        1000, ge=200, description="A turn up to this many characters is one memory; a longer one is remembered as passages."
    )
    memory_passage_chars: int = Field(
        600, ge=100, description="Length a long turn's passages are cut to, at paragraph and sentence breaks."
    )
    memory_summary_block_turns: int = Field(
        8,
        ge=0,
        description="A compaction remembers the turns it folds as summary memories, one per block of this many of "
        "the session's turns (their first sentences); 0 = none.",
    )
    query_embedding: Literal["local", "deployment"] = Field(
        "local",
        description="local: the ingress embeds queries itself (no Serve hop on the recall path); "
        "deployment: through the Embedder deployment.",
    )

    memorizer_sweep_interval_s: float = Field(
        0.25, gt=0, description="How often each memorizer replica reads the lanes (one pipeline over their shards)."
    )
    background_nice: int = Field(
        10,
        ge=0,
        le=19,
        description="Niceness steps the memorizer and embedder processes (background work) take below the request path, so "
        "requests win the CPU; 0 = off.",
    )
    memorizer_poke: bool = Field(
        False,
        description="Poke the memorizer on every append (one Serve call each) instead of leaving new turns to the "
        "sweep. Off: appends touch only Redis, and turns arriving within one sweep interval are embedded together.",
    )
    memorizer_batch_size: int = Field(
        64, ge=1, description="Turns of one session read and embedded in one step (one call to the Embedder)."
    )
    vector_repair: bool = Field(
        True,
        description="After Milvus restarts (and once when the memorizer starts), re-embed every memory PostgreSQL holds "
        "and Milvus lacks: Milvus Lite loses writes it acknowledged shortly before a crash.",
    )

    llm_mode: Literal["none", "openai", "ray-serve-llm"] = Field(
        "none",
        description="none: extractive summaries only, no chat endpoint; openai: any OpenAI-compatible endpoint at "
        "llm_base_url; ray-serve-llm: the ray.serve.llm OpenAI application deployed beside this one (configs/cluster.yaml), "
        "at llm_base_url.",
    )
    llm_base_url: str = Field(
        "http://127.0.0.1:8001/v1",
        description="The endpoint, /v1 included; in ray-serve-llm mode the route of the LLM application (set it: "
        "e.g. http://127.0.0.1:8000/llm/v1).",
    )
    llm_model: str = Field("qwen2.5-7b-instruct", description="Model name sent with each request (model_id in ray-serve-llm).")
    llm_api_key: str = Field("", description="API key sent to the LLM endpoint; empty: none. Masked in logs and error messages.")
    llm_timeout_s: float = Field(
        30.0, gt=0, description="Seconds one call to the LLM endpoint may take before it counts as failed."
    )
    llm_seed: int = Field(0, description="Seed sent with summary and extraction calls (they run at temperature 0).")
    llm_input_tokens: int = Field(6000, ge=64, description="Conversation tokens per LLM call; longer spans are folded in chunks.")
    llm_extract_max_tokens: int = Field(512, ge=16, le=4096, description="Output tokens of one fact-extraction call.")
    llm_context_window: int = Field(
        32768,
        ge=512,
        description="The model's context window for /v1/chat/completions when the endpoint does not report one "
        "(vLLM's max_model_len and ray.serve.llm's model card win).",
    )
    chat_default_user: str = Field(
        "default", pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$", description="User of a chat request that names none."
    )
    chat_user_header_wins: bool = Field(
        False,
        description="The X-User-Id header names a chat call's user even when the body's `user` names another: "
        "for a gateway that binds end users by header, so an end user cannot name another user of the tenant.",
    )
    chat_retry_window_s: int = Field(
        24 * 3600,
        gt=0,
        description="How long a chat call is remembered for its retries (an Idempotency-Key, or the openai SDK's "
        "x-stainless-retry-count): a retry within it stores nothing twice and gets the stored answer back.",
    )
    chat_max_completion_tokens: int = Field(
        1024, ge=1, description="Tokens reserved for the answer when a chat request gives no max_completion_tokens."
    )
    extraction_enabled: bool = Field(True, description="Extract structured facts when an LLM is configured.")
    extraction_max_facts: int = Field(8, ge=1, le=8, description="maxItems of the extraction schema.")
    extraction_max_attempts: int = Field(
        3, ge=1, description="Invalid outputs for one span before it is skipped (counted as rejects); outages never skip."
    )

    tracing: bool = Field(
        False,
        description="OpenTelemetry spans of every request (docs/operations/tracing.md), exported where the standard "
        "OTEL_* variables say (OTLP over http/protobuf by default: OTEL_EXPORTER_OTLP_ENDPOINT); needs the `otel` extra.",
    )
    tracing_spans_dir: str = Field(
        "",
        description="With tracing on: write spans as JSON lines to files in this directory (one per process) instead "
        "of exporting them; for tests and a look without a collector. Empty: export.",
    )

    @model_validator(mode="after")
    def _llm_endpoint_named(self) -> Settings:
        if self.llm_mode == "ray-serve-llm" and "llm_base_url" not in self.model_fields_set:
            raise ValueError(
                "llm_mode ray-serve-llm needs llm_base_url: the route of the ray.serve.llm application, "
                "e.g. http://127.0.0.1:8000/llm/v1 (configs/cluster.yaml)"
            )
        return self

    @model_validator(mode="after")
    def _passages_shorter_than_a_whole_turn(self) -> Settings:
        if self.memory_passage_chars >= self.memory_whole_chars:
            raise ValueError(
                f"memory_passage_chars ({self.memory_passage_chars}) must be below memory_whole_chars "
                f"({self.memory_whole_chars}): a turn is cut into passages only when it is longer than one"
            )
        return self

    @model_validator(mode="after")
    def _rerank_model_readable(self) -> Settings:
        self.rerank_model()  # a file that cannot be read or is not a model stops the start, with the reason
        return self

    def rerank_model(self):
        """The second stage's model: the shipped one, or `recall_rerank_model`'s (read once per process)."""
        return _rerank_model(self.recall_rerank_model)

    def keyring(self):
        """The API keys of `api_keys` and `api_keys_file` together."""
        from serve_app.core.auth import KeyRing

        tenants = {digest: value.removesuffix(":admin") for digest, value in self.api_keys.items()}
        ring = KeyRing(tenants, {digest for digest, value in self.api_keys.items() if value.endswith(":admin")})
        if self.api_keys_file:
            ring = ring.merged(KeyRing.from_file(self.api_keys_file))
        if self.require_api_keys and not ring.enabled:
            raise ValueError("require_api_keys is set but no API key is configured (api_keys or api_keys_file)")
        return ring

    def inspector_signer(self):
        """The signer of inspector sessions, or None when keys are on and no shared secret is set."""
        import secrets

        from serve_app.core.inspector_auth import SessionSigner

        secret = self.ui_secret.get_secret_value()
        if not secret:
            if self.keyring().enabled:
                return None
            secret = secrets.token_urlsafe(32)
        return SessionSigner(secret, self.ui_session_max_age_s)

    def redacted(self) -> dict[str, Any]:
        """Settings for logs, with credentials masked."""
        from serve_app.core.redaction import mask_password

        data = self.model_dump()
        for name, value in data.items():  # every URL or DSN, whatever its setting: deployments put passwords there
            if isinstance(value, str):
                data[name] = mask_password(value)
        data["milvus_token"] = "***" if self.milvus_token else ""
        data["llm_api_key"] = "***" if self.llm_api_key else ""
        return data


@lru_cache(maxsize=8)
def _rerank_model(path: str):
    from serve_app.core.rerank import SHIPPED_MODEL, SecondStage

    if not path:
        return SHIPPED_MODEL
    try:
        return SecondStage.from_file(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"recall_rerank_model {path!r} is not a second-stage model file: {exc}") from exc
