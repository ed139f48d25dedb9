"""Memorization as cursors, in two lanes. The embedding lane embeds turns after
`memorized_upto_seq` (and compacts, when there is no LLM); the LLM lane extracts facts after
`extracted_upto_seq`, compacts with an LLM summary when due and redoes degraded summaries once the
LLM answers again. The lanes are apart so that an LLM outage never holds up embedding.

At-least-once work with an exactly-once effect: vector ids are deterministic and a fact write that
repeats its value adds no row, so redoing a batch after a crash changes nothing; each cursor moves
only after its store confirmed the write, and never past work that failed. A lease per session and
lane in Redis keeps memorizer replicas from doing the same work side by side; a lease that lapses
(a replica died) only lets the work happen twice, never lets it be lost.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from enum import Enum

from serve_app.core import standing
from serve_app.core.clock import iso_to_datetime, iso_to_ms
from serve_app.core.ids import summary_memory_id, turn_memory_id
from serve_app.core.passages import passage_id, split_passages
from serve_app.core.session_summaries import SUMMARY_KIND, block_of, block_start, summary_blocks
from serve_app.core.spaces import space_owner
from serve_app.encoding import EmbedMany
from serve_app.errors import SessionNotFound
from serve_app.llm.client import ChatCall, ChatClient, LLMError
from serve_app.llm.prompts import extraction_messages, parse_extraction, response_format
from serve_app.services.compaction import CompactionOutcome, Redo, compact_session, redo_degraded
from serve_app.services.memory_writes import Provenance, delete_memories, memory_row, save_memories
from serve_app.services.summarizer import Summarizer, chunk_span
from serve_app.services.users import forget_promoted
from serve_app.settings import Settings
from serve_app.stores.bundle import Stores
from serve_app.stores.facts import Fact

logger = logging.getLogger("ray.serve")
MEMORIZED_ROLES = ("user", "assistant")
EMBED_LEASE_MS = 30_000  # renewed per batch: one batch of turns embeds and stores well inside it
SUMMARY_CHUNK_BLOCKS = 16  # summary blocks embedded and stored per step of a catch-up (within the lease)
Renew = Callable[[], Awaitable[None]]


def _said(turn: dict) -> bool:
    return turn["role"] in MEMORIZED_ROLES and bool((turn.get("content") or "").strip())


def _origin(turn: dict) -> tuple[int, int]:
    """Where and when a memory of the turn comes from: its seq and its instant."""
    return turn["seq"], iso_to_ms(turn.get("created_at"))


class Presence(Enum):
    """What became of a session while work read from it ran."""

    HERE = "here"
    DELETED = "deleted"
    REMADE = "remade"
    """Deleted and made again under the same id: another session."""
    FORGOTTEN = "forgotten"


@dataclass
class MemorizeReport:
    """What one pass did, for metrics and tests."""

    cursor: int = 0
    embedded: int = 0
    compaction: CompactionOutcome | None = None
    facts_written: int = 0
    summaries: int = 0
    """Summary blocks written (core/session_summaries.py)."""
    extraction_rejects: int = 0
    extraction_failed: bool = False
    redone: Redo = Redo.NOT_NEEDED
    skipped: bool = False
    """Another worker holds the session's lane: nothing was done here."""
    errors: list[str] = field(default_factory=list)

    @property
    def llm_trouble(self) -> bool:
        """The LLM failed somewhere in the pass: its work is owed still."""
        degraded = self.compaction is not None and self.compaction.degraded
        return self.extraction_failed or degraded or self.redone is Redo.STILL_DEGRADED


class SessionMemorizer:
    def __init__(self, stores: Stores, embed: EmbedMany, settings: Settings, llm: ChatClient | None = None):
        self.stores = stores
        self.log = stores.log
        self.vectors = stores.vectors
        self.facts = stores.facts
        self.embed = embed
        self.settings = settings
        self.llm = llm
        self.summarizer = Summarizer(
            llm,
            summary_max_tokens=settings.summary_max_tokens,
            llm_input_tokens=settings.llm_input_tokens,
            seed=settings.llm_seed,
        )
        self.extracts = llm is not None and settings.extraction_enabled
        self.llm_lease_ms = int(max(60.0, 3 * settings.llm_timeout_s) * 1000)  # renewed before each LLM call

    @asynccontextmanager
    async def _lane(self, tenant: str, session: str, lane: str, ttl_ms: int) -> AsyncIterator[Renew | None]:
        """The session's lease on a lane: a `renew` callable while held, None when another worker has it."""
        holder = uuid.uuid4().hex
        if not await self.log.lease(tenant, session, lane, holder, ttl_ms):
            yield None
            return

        async def renew() -> None:
            if not await self.log.renew_lease(tenant, session, lane, holder, ttl_ms):
                logger.warning("lease on %s/%s (%s) lapsed: the work may be done twice, never lost", tenant, session, lane)

        try:
            yield renew
        finally:
            try:
                await self.log.release_lease(tenant, session, lane, holder)
            except Exception as exc:  # it lapses by itself
                logger.warning("could not release the lease on %s/%s: %r", tenant, session, exc)

    async def compact(self, tenant: str, session: str, *, force: bool, on_conflict=lambda: None) -> CompactionOutcome:
        return await compact_session(
            self.log,
            tenant,
            session,
            summarizer=self.summarizer,
            trigger_tokens=self.settings.compaction_trigger_tokens,
            keep_rounds=self.settings.compaction_keep_rounds,
            force=force,
            on_conflict=on_conflict,
        )

    async def _remember_summaries(self, tenant: str, session: str, renew: Renew) -> int:
        """Bring the session's summary memories up to its checkpoint (core/session_summaries.py):
        the blocks of the turns checkpointed since `remembered_upto_seq`, the block that cursor
        stops inside written again whole, a chunk of blocks at a time, the cursor moved after each
        chunk is stored. In the lanes, after the checkpoint: a compaction (the API's among them)
        never waits for them, and a crash in between leaves the cursor behind for the next pass.
        Returns the blocks written."""
        size = self.settings.memory_summary_block_turns
        meta = await self.log.meta(tenant, session)
        if not size or meta is None or meta.covers_upto_seq <= meta.remembered_upto_seq:
            return 0
        written = 0
        done = meta.remembered_upto_seq
        while done < meta.covers_upto_seq:
            await renew()
            start = block_start(block_of(done + 1, size), size)
            upto = min(meta.covers_upto_seq, start - 1 + size * SUMMARY_CHUNK_BLOCKS)
            blocks = summary_blocks(await self.log.read(tenant, session, after=start - 1, limit=upto - start + 1), size)
            vectors = await self.embed([b.text for b in blocks], [False] * len(blocks)) if blocks else []
            rows = [
                memory_row(
                    self.settings,
                    memory_id=summary_memory_id(tenant, meta.user_id, session, meta.created_at_ms, block.index),
                    tenant=tenant,
                    user=meta.user_id,
                    text=block.text,
                    created_at_ms=iso_to_ms(block.created_at),
                    vector=vector,
                    session=session,
                    role=SUMMARY_KIND,
                    kind=SUMMARY_KIND,
                )
                for block, vector in zip(blocks, vectors, strict=True)
            ]
            await save_memories(self.stores, rows)
            presence = await self._presence(tenant, session, meta.user_id, meta.created_at_ms)
            if presence is not Presence.HERE:
                await self._erase(tenant, session, meta.user_id, presence, [(row.user_id, row.id) for row in rows])
                raise SessionNotFound(session)
            await self.log.advance_cursor(tenant, session, upto, done=False, cursor="remembered_upto_seq")
            written += len(rows)
            done = upto
        return written

    async def memorize(self, tenant: str, session: str, on_conflict=lambda: None) -> MemorizeReport:
        """The embedding lane: bring `memorized_upto_seq` to the last seq; without an LLM, compact too.

        Never calls the LLM: what the session owes it (extraction, an LLM summary, a redo) is left
        to `catch_up_llm`, whose lane the session joins once it is memorized."""
        report = MemorizeReport()
        async with self._lane(tenant, session, "embed", EMBED_LEASE_MS) as renew:
            if renew is None:
                report.skipped = True
                return report
            return await self._memorize(tenant, session, report, renew, on_conflict)

    async def _memorize(self, tenant: str, session: str, report: MemorizeReport, renew: Renew, on_conflict) -> MemorizeReport:
        batch = self.settings.memorizer_batch_size
        while True:
            await renew()
            meta = await self.log.meta(tenant, session)
            if meta is not None and await self.log.forgotten(tenant, meta.user_id, meta.created_at_ms):
                # A forgotten user's session that slipped through.
                await self._erase(tenant, session, meta.user_id, Presence.FORGOTTEN, [])
                meta = None
            if meta is None:
                await self.log.advance_cursor(tenant, session, 0, done=True)  # drops it from both lanes
                report.cursor = -1
                return report
            turns = await self.log.read(tenant, session, after=meta.memorized_upto_seq, limit=batch)
            if turns:
                written = await self._embed_turns(tenant, session, meta.user_id, turns)
                report.embedded += len(written)
                presence = await self._presence(tenant, session, meta.user_id, meta.created_at_ms)
                if presence is not Presence.HERE:
                    # Deleted, made again or forgotten while we embedded: remove what we just wrote.
                    await self._erase(tenant, session, meta.user_id, presence, written)
                    report.cursor = -1
                    return report
                if not self.extracts:
                    report.facts_written += await self._standing(tenant, session, meta.user_id, meta.created_at_ms, turns)
            done = len(turns) < batch
            if done:
                try:
                    if not self.uses_llm:
                        report.compaction = await self.compact(tenant, session, force=False, on_conflict=on_conflict)
                    report.summaries += await self._remember_summaries(tenant, session, renew)
                except SessionNotFound:  # deleted meanwhile: the next pass finds nothing to do
                    report.cursor = -1
                    return report
            upto = turns[-1]["seq"] if turns else meta.memorized_upto_seq
            report.cursor = await self.log.advance_cursor(tenant, session, upto, done=done, owes_llm=self.uses_llm)
            if done:
                return report

    @property
    def uses_llm(self) -> bool:
        return self.llm is not None

    async def catch_up_llm(self, tenant: str, session: str, on_conflict=lambda: None) -> MemorizeReport:
        """The LLM lane: extract facts after `extracted_upto_seq`, compact with an LLM summary when
        due, and redo a degraded summary. Each step stops at the LLM's first failure and leaves its
        cursor where it is; `llm_trouble` then says so and the lane retries later."""
        report = MemorizeReport()
        async with self._lane(tenant, session, "llm", self.llm_lease_ms) as renew:
            if renew is None:
                report.skipped = True
                return report
            return await self._catch_up_llm(tenant, session, report, renew, on_conflict)

    async def _catch_up_llm(self, tenant: str, session: str, report: MemorizeReport, renew: Renew, on_conflict) -> MemorizeReport:
        meta = await self.log.meta(tenant, session)
        if meta is None or await self.log.forgotten(tenant, meta.user_id, meta.created_at_ms):
            report.cursor = -1
            return report
        if self.extracts:
            await self._extract(tenant, session, meta.user_id, meta.created_at_ms, meta.extracted_upto_seq, report, renew)
            presence = await self._presence(tenant, session, meta.user_id, meta.created_at_ms)
            if presence is not Presence.HERE:
                await self._erase(tenant, session, meta.user_id, presence, [])
                report.cursor = -1
                return report
        try:
            await renew()
            report.compaction = await self.compact(tenant, session, force=False, on_conflict=on_conflict)
            report.summaries += await self._remember_summaries(tenant, session, renew)
            await renew()
            report.redone = await redo_degraded(self.log, tenant, session, summarizer=self.summarizer)
        except SessionNotFound:
            report.cursor = -1
        return report

    async def _presence(self, tenant: str, session: str, user: str, created_at_ms: int) -> Presence:
        """Whether the session the work was read from is still there. By its creation time, not its
        id alone: a session deleted and made again under the same id is another session."""
        meta = await self.log.meta(tenant, session)
        if meta is None:
            return Presence.DELETED
        if meta.created_at_ms != created_at_ms or meta.user_id != user:
            return Presence.REMADE
        if await self.log.forgotten(tenant, user, created_at_ms):
            return Presence.FORGOTTEN
        return Presence.HERE

    async def _erase(
        self, tenant: str, session: str, user: str, presence: Presence, written: list[tuple[str, str]]
    ) -> None:
        """What the work wrote for a session that is gone. A session made again keeps its log and
        memories: only the memories just written from the old log go (owner, id: a turn memorized
        into a space is the space's). Otherwise the session and its user's memories of it (another
        user's memories under a reused id stay)."""
        if presence is Presence.REMADE:
            for owner, memory_id in written:
                await delete_memories(self.stores, tenant, user=owner, session=session, memory_id=memory_id)
            return
        await self.log.delete(tenant, session)
        await delete_memories(self.stores, tenant, user=user, session=session)
        if presence is Presence.FORGOTTEN:  # turns memorized into spaces after the user was forgotten
            await forget_promoted(self.stores, tenant, user, self.settings.forget_promoted)

    async def _embed_turns(self, tenant: str, session: str, user: str, turns: list[dict]) -> list[tuple[str, str]]:
        """Write the said turns as memories (a long turn as its passages); returns (owner, id) of
        each written. A turn appended with a space is memorized into that space (its owner id),
        with the user it came from as its origin.

        A turn whose memory exists from another sighting (the same words resent after the log
        expired, or said twice) keeps that first memory and its date; the same turn again (a retried
        batch) is simply written again."""
        said = [t for t in turns if _said(t)]
        owners = {t["seq"]: space_owner(t["space"]) if t.get("space") else user for t in said}
        pieces = {t["seq"]: self._passages(t["content"]) for t in said}
        ids = {t["seq"]: self._memory_ids(tenant, owners[t["seq"]], session, t, pieces[t["seq"]]) for t in said}
        first = {}
        for owner in set(owners.values()):
            heads = [ids[t["seq"]][0] for t in said if owners[t["seq"]] == owner]
            first |= {h.id: h for h in await self.stores.keywords.fetch(tenant, owner, heads)}
        chosen: dict[str, dict] = {}  # the first memory id of each turn written -> the turn
        for turn in said:
            head = ids[turn["seq"]][0]
            seen = first.get(head)
            if head in chosen or (seen is not None and (seen.seq, seen.created_at_ms) != _origin(turn)):
                continue
            chosen[head] = turn
        if not chosen:
            return []
        texts = [text for turn in chosen.values() for text in pieces[turn["seq"]]]
        plain = [len(pieces[turn["seq"]]) > 1 for turn in chosen.values() for _ in pieces[turn["seq"]]]
        vectors = iter(await self.embed(texts, plain))
        context = await self._turns_before(tenant, session, turns[0]["seq"])
        wanted = self.settings.recall_keyword_context_turns
        rows = []
        for turn in turns:
            if not _said(turn):
                continue
            if chosen.get(ids[turn["seq"]][0]) is turn:
                # A turn's first memory carries the turns before it; a later passage the passage
                # before it, the context a reader of that passage has.
                before = [t["content"] for t in context[-wanted:]] if wanted else []
                owner = owners[turn["seq"]]
                provenance = Provenance(turn.get("agent_id"), origin_user=user if owner != user else None)
                for memory_id, text in zip(ids[turn["seq"]], pieces[turn["seq"]], strict=True):
                    rows.append(
                        memory_row(
                            self.settings,
                            memory_id=memory_id,
                            tenant=tenant,
                            user=owner,
                            text=text,
                            created_at_ms=iso_to_ms(turn.get("created_at")),
                            vector=next(vectors),
                            session=session,
                            seq=turn["seq"],
                            role=turn["role"],
                            kind="turn",
                            before=before,
                            provenance=provenance,
                        )
                    )
                    before = [text] if wanted else []
            context.append(turn)
        await save_memories(self.stores, rows)
        return [(row.user_id, row.id) for row in rows]

    def _passages(self, text: str) -> list[str]:
        return split_passages(text, target=self.settings.memory_passage_chars, whole=self.settings.memory_whole_chars)

    @staticmethod
    def _memory_ids(tenant: str, user: str, session: str, turn: dict, pieces: list[str]) -> list[str]:
        turn_id = turn_memory_id(tenant, user, session, turn["role"], turn["content"])
        if len(pieces) == 1:
            return [turn_id]
        return [passage_id(turn_id, i, len(pieces)) for i in range(1, len(pieces) + 1)]

    async def _turns_before(self, tenant: str, session: str, seq: int) -> list[dict]:
        """The said turns just before `seq` that index a memory's keywords with their context."""
        wanted = self.settings.recall_keyword_context_turns
        if not wanted or seq <= 1:
            return []
        window = 4 * wanted  # tool messages in between do not count
        earlier = await self.log.read(tenant, session, after=max(0, seq - 1 - window), limit=min(window, seq - 1))
        return [t for t in earlier if _said(t) and t["seq"] < seq][-wanted:]

    async def _extract(
        self, tenant: str, session: str, user: str, created_at_ms: int, after: int, report: MemorizeReport, renew: Renew
    ) -> None:
        """Facts from the turns after the extraction cursor, one chunk at a time; stops at a failure."""
        assert self.llm is not None
        turns = await self.log.read(tenant, session, after=after)
        if not turns:
            return
        for chunk in chunk_span(turns, self.settings.llm_input_tokens):
            said = [t for t in chunk if _said(t)]
            if said:
                await renew()
                known = [(f.key, f.value) for f in await self.facts.current(tenant, user)]
                call = ChatCall(
                    extraction_messages(known, said),
                    max_tokens=self.settings.llm_extract_max_tokens,
                    temperature=0.0,
                    seed=self.settings.llm_seed,
                    response_format=response_format(self.settings.extraction_max_facts),
                )
                try:
                    result = await self.llm.chat(call)
                    facts, rejected = parse_extraction(result.text, self.settings.extraction_max_facts)
                except LLMError as exc:  # the model is unreachable: retry later, never skip
                    logger.warning("extraction for %s/%s failed, retried later: %s", tenant, session, exc)
                    report.extraction_failed = True
                    report.errors.append(str(exc)[:200])
                    return
                except ValueError as exc:  # the model answered, but not the schema
                    attempts = await self.log.count_extraction_failure(tenant, session)
                    report.errors.append(str(exc)[:200])
                    if attempts < self.settings.extraction_max_attempts:
                        logger.warning("invalid extraction for %s/%s (attempt %d): %s", tenant, session, attempts, exc)
                        report.extraction_failed = True
                        return
                    logger.warning(
                        "skipping extraction of %s/%s up to seq %d after %d invalid outputs",
                        tenant,
                        session,
                        chunk[-1]["seq"],
                        attempts,
                    )
                    facts, rejected = [], 1
                report.extraction_rejects += rejected
                if await self._presence(tenant, session, user, created_at_ms) is not Presence.HERE:
                    return  # deleted, made again or forgotten while the model thought: write nothing
                seqs = [t["seq"] for t in said]
                said_at = max(filter(None, (iso_to_datetime(t.get("created_at")) for t in said)), default=None)
                for fact in facts:
                    _, changed = await self.facts.put(
                        tenant,
                        user,
                        fact.key,
                        fact.value,
                        fact.category,
                        source_session=session,
                        source_seqs=seqs,
                        said_at=said_at,
                    )
                    report.facts_written += int(changed)
                if facts and await self._undone_if_forgotten(tenant, user, created_at_ms):
                    report.facts_written = 0
                    return
            await self.log.advance_cursor(tenant, session, chunk[-1]["seq"], done=False, cursor="extracted_upto_seq")

    async def _standing(self, tenant: str, session: str, user: str, created_at_ms: int, turns: list[dict]) -> int:
        """Standing instructions and preferences in the user's turns, as facts (`core/standing.py`'s
        rules: without an LLM's extraction, the embedding lane finds them). A rule on the same thing
        as a kept one supersedes it under its key; the rows written are returned.

        Idempotent: a retried batch puts the same values again (no new row), and a rule whose key holds
        a rule said later (a batch retried or memorized late) is older news, not an update."""
        said = [
            (turn, rules)
            for turn in turns
            if turn["role"] == "user" and (rules := standing.standing_rules(turn.get("content") or ""))
        ]
        if not said:
            return 0
        current = {f.key: f for f in await self.facts.current(tenant, user)}
        written = 0
        for turn, rules in said:
            for rule in rules:
                kept = [(key, f.value) for key, f in current.items() if f.category in standing.STANDING_CATEGORIES]
                key = standing.key_for(rule, kept, taken=current)
                held = current.get(key)
                value = standing.rule_value(turn["content"], rules, rule)
                if held is not None and held.value != value and await self._said_later(tenant, session, held, turn):
                    continue
                current[key], changed = await self.facts.put(
                    tenant,
                    user,
                    key,
                    value,
                    rule.kind,
                    source_session=session,
                    source_seqs=[turn["seq"]],
                    said_at=iso_to_datetime(turn.get("created_at")),
                )
                written += int(changed)
        if written and await self._undone_if_forgotten(tenant, user, created_at_ms):
            return 0
        return written

    async def _undone_if_forgotten(self, tenant: str, user: str, created_at_ms: int) -> bool:
        """Whether the user was forgotten while facts were written for them; if so, those facts go.
        The forget set its tombstone before erasing, so what was written after it is erased here."""
        if not await self.log.forgotten(tenant, user, created_at_ms):
            return False
        await self.facts.forget(tenant, user)
        return True

    async def _said_later(self, tenant: str, session: str, held: Fact, turn: dict) -> bool:
        """Whether a kept fact comes from a turn said after `turn` (by seq in one session, else by the
        time the turns were said, while the other session's log is there to say it)."""
        if not held.source_session or not held.source_seqs:
            return False
        seq = min(held.source_seqs)
        if held.source_session == session:
            return seq > turn["seq"]
        source = await self.log.read(tenant, held.source_session, after=seq - 1, limit=1)
        if not source or source[0]["seq"] != seq:
            return False
        return iso_to_ms(source[0].get("created_at")) > iso_to_ms(turn.get("created_at"))
