"""Facts that change, on the real stores: when a user's memories state different values of one thing
at different times, the prompt shows both, each under its date, in date order, so that the model
reads which is the later."""

from __future__ import annotations

import re

from serve_app.schemas import AppendRequest, ContextRequestIn, MessageIn
from serve_app.services.context import build_working_memory
from serve_app.services.memorizer import SessionMemorizer
from serve_app.services.sessions import append_messages
from tests.services.seed import new_id

BERLIN = "My office is in Berlin."
MUNICH = "I moved, my office is now in Munich."


async def test_an_updated_fact_is_in_the_prompt_with_both_dates_in_order(deps, caller):
    tenant, user = caller.tenant, new_id("user")
    memorizer = SessionMemorizer(deps.stores, deps.embed_documents, deps.settings)
    # The later one is memorized first: the prompt's order is the dates', not the memorizer's.
    for text, when in ((MUNICH, "2024-09-16T08:30:00+00:00"), (BERLIN, "2024-02-05T10:00:00+00:00")):
        session = new_id("session")
        said = [MessageIn(role="user", content=text, created_at=when), MessageIn(role="assistant", content="Good to know.")]
        await append_messages(deps, caller, session, AppendRequest(user_id=user, messages=said))
        assert (await memorizer.memorize(tenant, session)).embedded == 2

    now = new_id("session")
    question = "Where is my office?"
    await append_messages(deps, caller, now, AppendRequest(user_id=user, messages=[MessageIn(role="user", content=question)]))
    built = await build_working_memory(
        deps, tenant, ContextRequestIn(user_id=user, session_id=now, query=question, max_tokens=2048)
    )

    system = built.messages[0]["content"]
    assert {BERLIN, MUNICH} <= {hit.text for hit in built.recalled}
    section = system[system.index("# Relevant memories") :]
    days = [(m.start(), m.group(1)) for m in re.finditer(r"^\[(\d{4}-\d{2}-\d{2})\]$", section, re.MULTILINE)]
    berlin, munich = section.index(BERLIN), section.index(MUNICH)
    day_of = {
        text: max((d for d in days if d[0] < at), default=(0, None))[1] for text, at in ((BERLIN, berlin), (MUNICH, munich))
    }
    assert day_of == {BERLIN: "2024-02-05", MUNICH: "2024-09-16"}
    assert berlin < munich
    assert built.usage.total_tokens <= built.usage.limit
