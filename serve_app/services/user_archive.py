"""Export a user's memory as a portable archive (core/user_archive.py), and import one into any user
of any tenant or deployment.

An import checks the whole archive before it writes anything (the same validation as each write:
messages as an append takes them, fact categories, memory kinds, the quota), then writes what the
target lacks, each step idempotent: a session's log gets the messages after those it already holds
(the same ones, or the import is refused with 409), its checkpoint when the target's covers less,
facts by (key, valid_from), memories under ids derived from their new owner. So importing twice
changes nothing, and an import cut short by a failure is finished by running it again.

Memories made from a log the archive carries are not copied but made again from it, as the service
makes them: the memorizer (the import hands it the session) embeds its turns and writes the summary
blocks of its checkpointed turns. Their ids then follow from the new owner as any memory's do, and
its later passes find them in place. Any other memory (its log expired, or it is of an earlier
conversation under a session id used again, or it was added directly) is copied, with its vector
when the archive was made under this service's embedding: a whole turn or a direct memory under the
id the service would give it, a passage or a summary block under `imported_memory_id`.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

from pydantic import ValidationError

from serve_app import schemas
from serve_app.core.auth import Caller
from serve_app.core.chat_history import fingerprint
from serve_app.core.clock import datetime_to_ms, ms_to_datetime
from serve_app.core.ids import direct_memory_id, imported_memory_id, renamed_session_id, turn_memory_id
from serve_app.core.passages import passage_id, passage_place, turn_of
from serve_app.core.records import FACT_CATEGORIES, MemoryRow
from serve_app.core.session_summaries import SUMMARY_KIND, summary_blocks
from serve_app.core.spaces import space_of
from serve_app.core.user_archive import (
    Archive,
    ArchiveError,
    Embedding,
    End,
    FactLine,
    Header,
    MemoryLine,
    MessageLine,
    SessionLine,
    dump_line,
    read_archive,
)
from serve_app.encoding import DOCUMENT_EMBEDDING
from serve_app.errors import Conflict, InvalidRequest, SessionOwnerError
from serve_app.services.audit import record
from serve_app.services.dependencies import Dependencies
from serve_app.services.memory_writes import DIRECT, Provenance, memory_row, save_memories
from serve_app.services.quota import check_memory_quota
from serve_app.stores.facts import Fact

PAGE = 500
APPEND_CHUNK = 100
EMBED_CHUNK = 64
MEMORY_KINDS = ("turn", DIRECT, SUMMARY_KIND)


class _Memory(NamedTuple):
    """A memory to write: what `memory_row` needs besides its vector."""

    id: str
    text: str
    kind: str
    role: str
    session: str = ""
    seq: int = 0
    created_ms: int = 0
    before: tuple[str, ...] = ()
    """Its keyword context: a copied passage is indexed with the passage before it, as the memorizer did."""
    vector: list[float] | None = None
    """The archive's vector, taken when the archive was made under this service's embedding."""
    provenance: Provenance | None = None


def embedding_model(model_path: str) -> str:
    """The model's name as an archive records it: its folder's name, not a path on this machine."""
    return Path(model_path).name if model_path else "all-MiniLM-L6-v2"


def our_embedding(deps: Dependencies) -> Embedding:
    settings = deps.settings
    return Embedding(
        model=embedding_model(settings.embedding_model), document_embedding=DOCUMENT_EMBEDDING, int8=settings.embedding_int8
    )


def _exact(vector: list[float]) -> list[float]:
    """Nine significant digits: as many as a float32 needs to come back bit for bit."""
    return [float(f"{x:.9g}") for x in vector]


async def export_lines(deps: Dependencies, tenant: str, user: str, *, vectors: bool = True) -> AsyncIterator[str]:
    """The user's archive, a line at a time: each session's log is read whole before its lines go
    out (its line says how many follow), memories (with their vectors, unless `vectors` is off)
    and facts a page at a time."""
    stores = deps.stores
    counts = {"sessions": 0, "messages": 0, "memories": 0, "facts": 0}
    space = space_of(user)
    header = Header(user_id=space or user, exported_at=datetime.now(UTC), embedding=our_embedding(deps), vectors=vectors)
    yield dump_line(header.model_copy(update={"space": True}) if space else header)
    for session in sorted(s for s, _ in await stores.log.user_sessions(tenant, user)):
        meta = await stores.log.meta(tenant, session)
        if meta is None or meta.user_id != user:
            continue  # deleted, or made again by another user, since the index was read
        messages = await stores.log.read(tenant, session)
        yield dump_line(
            SessionLine(
                session_id=session,
                messages=len(messages),
                summary=meta.summary,
                covers_upto_seq=min(meta.covers_upto_seq, len(messages)),
                summary_degraded=meta.summary_degraded,
                summary_state=meta.summary_state,
            )
        )
        for message in messages:
            seq = message.pop("seq")
            yield dump_line(MessageLine(session_id=session, seq=seq, message=message))
        counts["sessions"] += 1
        counts["messages"] += len(messages)
    after = ""
    while page := await stores.keywords.page(tenant, user, after=after, limit=PAGE):
        stored = await stores.vectors.vectors_of(tenant, user, [hit.id for hit in page]) if vectors else {}
        for hit in page:
            yield dump_line(
                MemoryLine(
                    id=hit.id,
                    kind=hit.kind,
                    role=hit.role,
                    text=hit.text,
                    session_id=hit.session_id,
                    seq=hit.seq,
                    created_at=ms_to_datetime(hit.created_at_ms) if hit.created_at_ms else None,
                    vector=_exact(stored[hit.id]) if hit.id in stored else None,
                    agent_id=hit.agent_id,
                    added_by=hit.added_by,
                    origin_user=hit.origin_user,
                    origin_memory=hit.origin_memory,
                )
            )
        counts["memories"] += len(page)
        after = page[-1].id
    for fact in await stores.facts.every_row(tenant, user):
        yield dump_line(FactLine(**fact.__dict__))
        counts["facts"] += 1
    yield dump_line(End(counts=counts))


async def import_lines(deps: Dependencies, caller: Caller, user: str, lines: Iterable[str | bytes]) -> schemas.ImportReport:
    """Read an archive and import it into the caller's tenant's `user`; the import is audited."""
    try:
        archive = read_archive(lines)
    except ArchiveError as exc:
        raise InvalidRequest(f"not an archive this service reads: {exc}") from None
    report = await import_archive(deps, caller.tenant, user, archive)
    target = {"user_id": user, "from_user": archive.header.user_id}
    result = {"messages": report.messages_added, "memories": report.memories_written, "facts": report.facts_added}
    await record(deps, caller, "import_user", target, result)
    return report


def _messages_in(archive: Archive) -> dict[str, list[schemas.MessageIn]]:
    """Every message as an append would take it, or InvalidRequest naming the first that is not."""
    out: dict[str, list[schemas.MessageIn]] = {}
    for session, lines in archive.messages.items():
        taken = []
        for line in lines:
            try:
                taken.append(schemas.MessageIn.model_validate(line.message))
            except ValidationError as exc:
                error = exc.errors()[0]
                where = ".".join(str(p) for p in error["loc"])
                raise InvalidRequest(f"session {session}, seq {line.seq}: {where}: {error['msg']}") from None
        out[session] = taken
    return out


def _check(archive: Archive) -> None:
    for fact in archive.facts:
        if fact.category not in FACT_CATEGORIES:
            raise InvalidRequest(f"fact {fact.key}: category must be one of {', '.join(FACT_CATEGORIES)}")
    for memory in archive.memories:
        if memory.kind not in MEMORY_KINDS:
            raise InvalidRequest(f"memory {memory.id}: kind must be one of {', '.join(MEMORY_KINDS)}")


async def import_archive(deps: Dependencies, tenant: str, user: str, archive: Archive) -> schemas.ImportReport:
    """Write what the target user lacks of the archive (module docstring): nothing when the archive
    does not validate, and nothing new when it was imported before."""
    _check(archive)
    messages = _messages_in(archive)
    remade = _remade(archive, deps.settings.memory_summary_block_turns)
    copied = [m for m in archive.memories if not remade(m)]
    await check_memory_quota(deps, tenant, len(copied) + sum(len(m) for m in messages.values()))
    now = datetime.now(UTC)
    stored = {name: [m.stored(now) for m in taken] for name, taken in messages.items()}
    places = {s.session_id: await _place(deps, tenant, user, s.session_id, stored[s.session_id]) for s in archive.sessions}
    report = schemas.ImportReport(user_id=user)
    for session in archive.sessions:
        name, held = places[session.session_id]
        if name != session.session_id:
            report.renamed[session.session_id] = name
        placed = session.model_copy(update={"session_id": name})
        await _import_session(deps, tenant, user, placed, stored[session.session_id], held, report)
    same = archive.header.embedding == our_embedding(deps)
    report.memories_written += await _copy_memories(deps, tenant, user, copied, same)
    report.facts_added = await deps.stores.facts.restore(tenant, user, [_fact(f) for f in archive.facts])
    return report


def _remade(archive: Archive, block_turns: int):
    """Whether the memorizer makes this memory again from a log the archive carries: a turn (or a
    passage of one) said at its seq in that log, or a summary block of that log's checkpointed turns.
    A memory of an earlier conversation under the same session id (its log expired, the id used
    again) is not, and is copied."""
    said = {(s, line.seq): line.message for s, lines in archive.messages.items() for line in lines}
    blocks: set[tuple[str, str]] = set()
    for session in archive.sessions if block_turns else ():
        covered = [line.message | {"seq": line.seq} for line in archive.messages[session.session_id][: session.covers_upto_seq]]
        blocks |= {(session.session_id, block.text) for block in summary_blocks(covered, block_turns)}

    def remade(memory: MemoryLine) -> bool:
        if memory.kind == SUMMARY_KIND:
            return (memory.session_id, memory.text) in blocks
        message = said.get((memory.session_id, memory.seq)) if memory.kind == "turn" else None
        if message is None or message.get("role") != memory.role:
            return False
        content = str(message.get("content") or "")
        return memory.text in content if passage_place(memory.id) is not None else memory.text == content

    return remade


async def _place(deps: Dependencies, tenant: str, user: str, session: str, stored: list[dict]) -> tuple[str, int]:
    """Where the session goes (its id, or `renamed_session_id` where another user of the tenant holds
    that id) and how many of its messages the target holds there already: the archive's first ones,
    or the import is refused before anything is written."""
    for name in (session, renamed_session_id(session, user)):
        meta = await deps.stores.log.meta(tenant, name)
        if meta is None:
            return name, 0
        if meta.user_id != user:
            continue
        held = await deps.stores.log.read(tenant, name)
        if len(held) > len(stored) or any(fingerprint(h) != fingerprint(s) for h, s in zip(held, stored, strict=False)):
            raise Conflict(f"session {name} holds other messages than the archive's: delete it, or import into another user")
        return name, len(held)
    raise SessionOwnerError(session)


async def _import_session(
    deps: Dependencies,
    tenant: str,
    user: str,
    session: SessionLine,
    stored: list[dict],
    held: int,
    report: schemas.ImportReport,
) -> None:
    log, name = deps.stores.log, session.session_id
    for start in range(held, len(stored), APPEND_CHUNK):
        await log.append(tenant, name, user, stored[start : start + APPEND_CHUNK])
    report.messages_added += len(stored) - held
    meta = await log.meta(tenant, name)
    if meta is None:  # an archive's session without messages: nothing to hold a checkpoint
        return
    report.sessions.append(name)
    covers = min(session.covers_upto_seq, len(stored))
    if covers > meta.covers_upto_seq:
        written = await log.write_checkpoint(
            tenant,
            name,
            expected_version=meta.version,
            summary=session.summary,
            covers_upto_seq=covers,
            degraded=session.summary_degraded,
            state=session.summary_state,
        )
        if written is None:
            raise Conflict(f"session {name} was compacted during the import: import again", retry_after_s=1)
    if deps.poke is not None and held < len(stored):
        deps.poke(tenant, name)  # the memorizer makes its turns' memories and its checkpoint's summary blocks


_DERIVED_DIRECT_ID = re.compile(r"m[0-9a-f]{32}")
"""The id `direct_memory_id` gives: any other is the caller's own, kept as it is."""


def _copied_id(tenant: str, user: str, memory: MemoryLine) -> str:
    if memory.kind == DIRECT:
        return direct_memory_id(tenant, user, memory.text) if _DERIVED_DIRECT_ID.fullmatch(memory.id) else memory.id
    place = passage_place(memory.id) if memory.kind == "turn" else None
    if memory.kind == "turn" and place is None:
        return turn_memory_id(tenant, user, memory.session_id, memory.role, memory.text)
    # A passage's or a block's id derives from what the archive no longer holds (the whole turn, the
    # session's first creation): a digest of the new owner and the old id, the same on every import.
    copied = imported_memory_id(tenant, user, "t" if memory.kind == "turn" else "s", turn_of(memory.id))
    return passage_id(copied, *place) if place is not None else copied


async def _copy_memories(deps: Dependencies, tenant: str, user: str, memories: list[MemoryLine], same: bool) -> int:
    passages = {
        (turn_of(m.id), place[0]): m.text for m in memories if m.kind == "turn" and (place := passage_place(m.id))
    }

    def before(memory: MemoryLine) -> tuple[str, ...]:
        place = passage_place(memory.id) if memory.kind == "turn" else None
        earlier = passages.get((turn_of(memory.id), place[0] - 1)) if place else None
        return (earlier,) if earlier is not None else ()

    rows = [
        _Memory(_copied_id(tenant, user, m), m.text, m.kind, m.role, m.session_id, m.seq,
                datetime_to_ms(m.created_at) if m.created_at else 0, before(m), m.vector if same else None,
                Provenance(m.agent_id, m.added_by, m.origin_user, m.origin_memory))
        for m in memories
    ]  # fmt: skip
    held: set[str] = set()
    for start in range(0, len(rows), PAGE):
        held |= {hit.id for hit in await deps.stores.keywords.fetch(tenant, user, [r.id for r in rows[start : start + PAGE]])}
    return await _write(deps, tenant, user, [r for r in rows if r.id not in held])


async def _write(deps: Dependencies, tenant: str, user: str, rows: list[_Memory]) -> int:
    """Embed and save the memories, a chunk at a time (a passage embedded alone, as the memorizer does)."""
    written = 0
    for start in range(0, len(rows), EMBED_CHUNK):
        chunk = rows[start : start + EMBED_CHUNK]
        dim = deps.settings.embedding_dim
        fresh = [m for m in chunk if m.vector is None or len(m.vector) != dim]
        plain = [m.kind == "turn" and passage_place(m.id) is not None for m in fresh]
        embedded = await deps.embed_documents([m.text for m in fresh], plain) if fresh else []
        made = dict(zip([m.id for m in fresh], embedded, strict=True))
        vectors = [made.get(m.id) or m.vector for m in chunk]
        memories: list[MemoryRow] = [
            memory_row(
                deps.settings,
                memory_id=m.id,
                tenant=tenant,
                user=user,
                text=m.text,
                created_at_ms=m.created_ms,
                vector=vector,
                session=m.session,
                seq=m.seq,
                role=m.role,
                kind=m.kind,
                before=m.before if deps.settings.recall_keyword_context_turns else (),
                provenance=m.provenance,
            )
            for m, vector in zip(chunk, vectors, strict=True)
        ]
        written += await save_memories(deps.stores, memories)
    return written


def _fact(line: FactLine) -> Fact:
    return Fact(
        key=line.key,
        value=line.value,
        category=line.category,
        source_session=line.source_session,
        source_seqs=line.source_seqs,
        valid_from=line.valid_from,
        valid_to=line.valid_to,
        agent_id=line.agent_id,
        added_by=line.added_by,
        origin_user=line.origin_user,
        said_at=line.said_at,
    )
