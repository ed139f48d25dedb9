"""Background passes that bring the two indexes of long-term memories back in line with
PostgreSQL, the record: vectors Milvus lost, vectors an older embedding or key scheme wrote, keywords
an older analysis indexed.

Milvus Lite acknowledges a write before it is on disk, and a kill -9 loses the last ones
(bench/reliability.py found such losses), so after Milvus restarts `repair_vectors` embeds again what
PostgreSQL has and Milvus lacks. The passes that write vectors from PostgreSQL skip (and count) a
memory no Milvus row can hold, rather than stop at it: the memories after it still get theirs.
"""

from __future__ import annotations

import itertools
import logging
from typing import NamedTuple

from serve_app.core.records import Hit, MemoryRow, unstorable
from serve_app.encoding import EmbedMany, Vector
from serve_app.services.memory_writes import memory_row
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores

logger = logging.getLogger("ray.serve")


class VectorPass(NamedTuple):
    """What a pass that writes vectors from PostgreSQL did."""

    written: int
    unstorable: int
    """Memories skipped because no Milvus row can hold them (each pass meets and counts them again)."""


async def repair_vectors(stores: Stores, embed: EmbedMany, *, chunk: int = 256) -> VectorPass:
    """Give Milvus back every memory PostgreSQL holds and Milvus lacks (same text, same model,
    so the same vector), compared by the memories' keys under this code's key scheme. Idempotent,
    safe to run any time."""
    repaired = skipped = 0
    for tenant, user in await stores.keywords.users():
        ids = await stores.keywords.memory_ids(tenant, user)
        missing = sorted(await stores.vectors.missing(tenant, user, ids))
        written = 0
        for start in range(0, len(missing), chunk):
            hits, bad = _storable(tenant, user, await stores.keywords.fetch(tenant, user, missing[start : start + chunk]))
            skipped += bad
            written += len(await _write_vectors(stores, embed, tenant, user, hits))
        if written:
            logger.warning("repaired %d vectors of %.80r/%.80r that Milvus had lost", written, tenant, user)
        repaired += written
    return VectorPass(repaired, skipped)


async def reembed_vectors(stores: Stores, embed: EmbedMany, *, chunk: int = 256, max_chunks: int | None = None) -> VectorPass:
    """Embed again, under this code's document embedding, every memory an older one embedded.
    Resumable: each chunk is recorded once its vectors are written, so a restart goes on with the
    memories still stale."""
    done = skipped = chunks = 0
    while max_chunks is None or chunks < max_chunks:
        stale = await stores.keywords.embedded_before(limit=chunk)
        if not stale:
            break
        marked = 0
        for (tenant, user), group in itertools.groupby(stale, key=lambda item: (item[0], item[1])):
            hits, bad = _storable(tenant, user, [hit for _, _, hit in group])
            skipped += bad
            written = await _write_vectors(stores, embed, tenant, user, hits)
            marked += await stores.keywords.mark_embedded(tenant, user, list(written.values()))
        done += marked
        chunks += 1
        if not marked:  # each one changed or went meanwhile (its writer wrote it), or cannot be stored
            break
    if done:
        logger.info("embedded %d memories again under the current document embedding", done)
    return VectorPass(done, skipped)


async def move_vectors(stores: Stores, embed: EmbedMany, *, chunk: int = 256, max_chunks: int | None = None) -> VectorPass:
    """Write under this code's key scheme every memory whose vector an older scheme holds: the vector
    copied from the older collection where it is this code's embedding of the memory (no model call),
    embedded from PostgreSQL's text where it is not, or where that collection lacks it (lost, or
    replaced by another owner's memory of the same id). Resumable: each chunk is recorded once its
    vectors are written. Once a pass finds none left, the older collection is dropped."""
    done = skipped = chunks = 0
    after: tuple[str, str, str] | None = None
    while max_chunks is None or chunks < max_chunks:
        stale = await stores.keywords.keyed_before(after=after, limit=chunk)
        if not stale:
            await stores.vectors.drop_legacy()
            break
        last_tenant, last_user, last, _ = stale[-1]
        after = (last_tenant, last_user, last.id)
        for (tenant, user), group in itertools.groupby(stale, key=lambda item: (item[0], item[1])):
            group = list(group)
            hits, bad = _storable(tenant, user, [hit for _, _, hit, _ in group])
            skipped += bad
            current = {hit.id for _, _, hit, embedded_now in group if embedded_now}
            copied = await stores.vectors.legacy_vectors(tenant, user, [h.id for h in hits if h.id in current])
            written = await _write_vectors(stores, embed, tenant, user, hits, copied)
            done += await stores.keywords.mark_keyed(tenant, user, list(written.values()))
        chunks += 1
    if done:
        logger.info("moved the vectors of %d memories to keys scoped to their owners", done)
    return VectorPass(done, skipped)


def _storable(tenant: str, user: str, hits: list[Hit]) -> tuple[list[Hit], int]:
    """The memories a Milvus row can hold, and how many it cannot (logged: PostgreSQL keeps them)."""
    kept = []
    for hit in hits:
        why = unstorable(_vector_row(tenant, user, hit, []))
        if why is None:
            kept.append(hit)
        else:
            logger.warning("memory %.80r of %.80r/%.80r has no Milvus row: %s", hit.id, tenant, user, why)
    return kept, len(hits) - len(kept)


async def _write_vectors(
    stores: Stores, embed: EmbedMany, tenant: str, user: str, hits: list[Hit], known: dict[str, Vector] | None = None
) -> dict[str, Hit]:
    """Write the vectors of memories PostgreSQL holds (those in `known` as given, the others
    embedded); returns the memories as PostgreSQL holds them after the write, by id (their vectors
    are then their texts')."""
    if not hits:
        return {}
    known = known or {}
    fresh = [h for h in hits if h.id not in known]
    vectors = await embed([h.text for h in fresh], [h.place is not None for h in fresh]) if fresh else []
    embedded = dict(zip([h.id for h in fresh], vectors, strict=True))
    rows = [_vector_row(tenant, user, h, known[h.id] if h.id in known else embedded[h.id]) for h in hits]
    await stores.vectors.upsert(rows)
    # A delete that ran between the fetch and the upsert took the row out of PostgreSQL: take this
    # copy out of Milvus too. A rewrite of the same id meanwhile: write it again.
    now = {h.id: h for h in await stores.keywords.fetch(tenant, user, [r.id for r in rows])}
    for row in rows:
        if row.id not in now:
            await stores.vectors.delete(tenant_id=tenant, user_id=user, id=row.id)
    changed = [now[r.id] for r in rows if r.id in now and now[r.id].text != r.text]
    if changed:
        again = await embed([h.text for h in changed], [h.place is not None for h in changed])
        await stores.vectors.upsert([_vector_row(tenant, user, h, v) for h, v in zip(changed, again, strict=True)])
    return now


async def reindex_keywords(stores: Stores, settings: Settings, *, chunk: int = 500, max_chunks: int | None = None) -> int:
    """Index again, under this code's keyword analysis, every memory indexed with an older one;
    returns how many were. Resumable: each chunk commits with its rows' analysis stamp, so a restart
    goes on with the rows still stale. A memory indexed before its context was kept takes it from the
    turn memories before it in its session."""
    done = chunks = 0
    wanted = settings.recall_keyword_context_turns
    while max_chunks is None or chunks < max_chunks:
        stale = await stores.keywords.stale(limit=chunk)
        if not stale:
            break
        rows = []
        for (tenant, user), group in itertools.groupby(stale, key=lambda m: (m.row.tenant_id, m.row.user_id)):
            group = list(group)
            unknown = sorted({m.row.session_id for m in group if not m.context_known and m.row.kind == "turn"})
            turns = await stores.keywords.session_turns(tenant, user, unknown) if unknown else {}
            for memory in group:
                row = memory.row
                before = row.context
                if not memory.context_known:
                    earlier = [text for seq, text in turns.get(row.session_id, []) if seq < row.seq]
                    before = tuple(earlier[-wanted:]) if wanted and row.kind == "turn" else ()
                rows.append(
                    memory_row(
                        settings,
                        memory_id=row.id,
                        tenant=tenant,
                        user=user,
                        text=row.text,
                        created_at_ms=row.created_at_ms,
                        vector=[],
                        session=row.session_id,
                        seq=row.seq,
                        role=row.role,
                        kind=row.kind,
                        before=before,
                    )
                )
        done += await stores.keywords.reindex(rows)
        chunks += 1
    if done:
        logger.info("re-indexed the keywords of %d memories", done)
    return done


def _vector_row(tenant: str, user: str, hit: Hit, vector: Vector) -> MemoryRow:
    """The Milvus row of a memory PostgreSQL holds (its keyword text stays as indexed there)."""
    return MemoryRow(
        id=hit.id,
        tenant_id=tenant,
        user_id=user,
        session_id=hit.session_id,
        seq=hit.seq,
        role=hit.role,
        kind=hit.kind,
        text=hit.text,
        created_at_ms=hit.created_at_ms,
        vector=vector,
    )
