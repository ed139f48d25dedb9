"""Standing instructions and preferences on the real stores: what a user says in one session that
holds from then on is found by the memorizer (the rule-based detector: no LLM here), kept as a fact
with history, and carried in its own section of the prompt of a later session for a request it
bears on, even when the request's words do not match it."""

from __future__ import annotations

from serve_app.core.budget import FACTS_HEADER, STANDING_HEADER
from serve_app.core.tokenizer import count_tokens
from serve_app.schemas import AppendRequest, ContextRequestIn, MessageIn
from serve_app.services.context import build_working_memory
from serve_app.services.dependencies import Dependencies
from serve_app.services.memorizer import SessionMemorizer
from serve_app.services.sessions import append_messages
from tests.services.seed import new_id

DATES = "Always format dates as YYYY-MM-DD."
DATES_LATER = "From now on, format dates as DD/MM/YYYY please."
DENTIST = "When is my dentist appointment?"


class User:
    """One user's sessions, each memorized as the embedding lane memorizes it."""

    def __init__(self, deps: Dependencies, caller):
        self.deps, self.caller, self.tenant = deps, caller, caller.tenant
        self.id = new_id("user")
        self.memorizer = SessionMemorizer(deps.stores, deps.embed_documents, deps.settings)
        self.sessions: list[str] = []

    async def session(self, *said: str, when: str = "2024-03-01T09:00:00+00:00") -> str:
        session = new_id("session")
        self.sessions.append(session)
        messages = []
        for text in said:
            messages += [MessageIn(role="user", content=text, created_at=when), MessageIn(role="assistant", content="Noted.")]
        await append_messages(self.deps, self.caller, session, AppendRequest(user_id=self.id, messages=messages))
        report = await self.memorizer.memorize(self.tenant, session)
        assert report.cursor == 2 * len(said) and not report.errors
        return session

    async def context(self, session: str, query: str):
        await append_messages(
            self.deps, self.caller, session, AppendRequest(user_id=self.id, messages=[MessageIn(role="user", content=query)])
        )
        return await build_working_memory(
            self.deps, self.tenant, ContextRequestIn(user_id=self.id, session_id=session, query=query, max_tokens=2048)
        )


def _section(system: str) -> str:
    """The standing section of a system prompt ("" when it has none)."""
    if STANDING_HEADER not in system:
        return ""
    start = system.index(STANDING_HEADER)
    ends = [i for i in (system.find(FACTS_HEADER, start), system.find("\n\n# Relevant memories", start)) if i > 0]
    return system[start : min(ends, default=len(system))]


async def test_an_instruction_of_session_1_is_in_the_prompt_of_session_9_and_a_later_one_supersedes_it(deps, caller):
    user = User(deps, caller)
    await user.session("Hi! I need help planning the next few months.", DATES, when="2024-03-01T09:00:00+00:00")
    facts = await deps.stores.facts.current(user.tenant, user.id)
    assert [(f.category, f.value, f.source_seqs) for f in facts] == [("instruction", DATES, [3])]
    key = facts[0].key
    assert key == "instruction.format-dates-yyyy-mm-dd"
    for month, topic in enumerate(
        ["the garden", "a new bike", "my sister's wedding", "tax forms", "a job offer", "rain", "a haircut"]
    ):
        await user.session(f"Let us talk about {topic}.", when=f"2024-{4 + month:02d}-10T09:00:00+00:00")
    ninth = new_id("session")
    assert len(user.sessions) == 8  # the ninth is the one asking

    built = await user.context(ninth, DENTIST)  # shares no word with the instruction
    system = built.messages[0]["content"]
    assert DATES in _section(system) and _section(system).startswith(STANDING_HEADER)
    assert [f.key for f in built.standing] == [key] and built.facts == []
    assert built.usage.total_tokens <= built.usage.limit
    assert built.usage.sections["memory"].tokens >= count_tokens(_section(system)) - 2  # counted in the memory section

    # A later instruction on the same thing, in another session: it supersedes, the history keeps both.
    await user.session(DATES_LATER, when="2024-11-01T09:00:00+00:00")
    history = await deps.stores.facts.history(user.tenant, user.id, key)
    assert [f.value for f in history] == [DATES, DATES_LATER]
    assert history[0].valid_to is not None and history[1].valid_to is None
    assert history[0].source_session == user.sessions[0] and history[1].source_session == user.sessions[-1]
    again = await user.context(ninth, DENTIST)
    section = _section(again.messages[0]["content"])
    assert DATES_LATER in section and DATES not in section

    # The embedding lane's batch done again (a retry) writes no row.
    turns = await deps.stores.log.read(user.tenant, user.sessions[0], after=0)
    meta = await deps.stores.log.meta(user.tenant, user.sessions[0])
    assert await user.memorizer._standing(user.tenant, user.sessions[0], user.id, meta.created_at_ms, turns) == 0
    assert [f.value for f in await deps.stores.facts.history(user.tenant, user.id, key)] == [DATES, DATES_LATER]


async def test_a_preference_is_in_the_prompt_only_for_a_request_that_shares_a_word_with_it(deps, caller):
    user = User(deps, caller)
    await user.session("I love jazz, especially live.", "Call me Sam.")
    kept = {f.value: f for f in await deps.stores.facts.current(user.tenant, user.id)}
    assert {v: f.category for v, f in kept.items()} == {
        "I love jazz, especially live.": "preference",
        "Call me Sam.": "instruction",
    }
    later = new_id("session")

    music = await user.context(later, "Any jazz concerts this weekend?")
    section = _section(music.messages[0]["content"])
    assert "I love jazz, especially live." in section and "Call me Sam." in section
    assert {f.category for f in music.standing} == {"preference", "instruction"}

    dentist = await user.context(later, DENTIST)
    section = _section(dentist.messages[0]["content"])
    assert "Call me Sam." in section and "jazz" not in section  # the instruction always bears; the preference not
    assert [f.value for f in dentist.standing] == ["Call me Sam."]


async def test_rules_are_dated_and_ordered_by_when_they_were_said_not_when_they_were_memorized(deps, caller):
    """Two rules that are not on the same thing are both kept, and the prompt shows them newest
    first, each with its date: the date the user said it. Sessions are memorized in whatever order
    the memorizer reaches them (a backlog, an imported history), so the later rule may be the first
    one memorized."""
    user = User(deps, caller)
    french, german = new_id("session"), new_id("session")
    for session, rule, when in (
        (french, "From now on, reply in French.", "2024-03-01T09:00:00+00:00"),
        (german, "From now on, reply in German.", "2024-05-20T09:00:00+00:00"),
    ):
        messages = [MessageIn(role="user", content=rule, created_at=when), MessageIn(role="assistant", content="Noted.")]
        await append_messages(deps, caller, session, AppendRequest(user_id=user.id, messages=messages))
    for session in (german, french):  # the later rule memorized first
        report = await user.memorizer.memorize(user.tenant, session)
        assert report.cursor == 2 and not report.errors

    built = await user.context(new_id("session"), DENTIST)
    assert [f.value for f in built.standing] == ["From now on, reply in German.", "From now on, reply in French."]
    section = _section(built.messages[0]["content"])
    assert "[2024-05-20] From now on, reply in German." in section
    assert "[2024-03-01] From now on, reply in French." in section
    assert section.index("German") < section.index("French")
