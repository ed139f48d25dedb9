"""The chat path against every sequence of calls: a generated test (Hypothesis' rule-based state
machine) drives the endpoint in process on the real session log, its model a scripted upstream
(TEST DOUBLE), against a reference model of each conversation.

Clients of four kinds talk at once: one resends its whole history with a session id, one sends only
its newest turn with a session id, one drops its oldest turns, one sends no session id. Steps: a new
turn (often the same words as before), a retry of a call whose response was lost before or after its
answer was stored, `store: false`, an edited or regenerated last turn, two calls at once in one
session, tool calls with their results. After every step: each log holds the client's turns in
order, each as often as it was sent as new; every answer returned with store on is in the log once
and no other answer is; every prompt the model got ended with the request's newest turn; no 5xx
but the upstream failure the step injected.

`MEMSERVE_CHAT_PROPERTY_EXAMPLES` sets how many conversations are generated (the suite runs a few;
the long run for the note, thousands of steps, sets it high).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from serve_app.core.chat_history import fingerprint
from tests.contract.chat_app import chat_app
from tests.doubles import ScriptedUpstream

EXAMPLES = int(os.environ.get("MEMSERVE_CHAT_PROPERTY_EXAMPLES", "12"))
STEPS = int(os.environ.get("MEMSERVE_CHAT_PROPERTY_STEPS", "14"))
URL = "/v1/chat/completions"
WORDS = st.sampled_from(["continue", "ok", "Write a plan", "Hi", "why?", "ORD-4411 for $129.99", "ok  "])
KINDS = ("whole", "newest", "dropper", "sessionless")


@dataclass
class Client:
    kind: str
    user: str
    session: str | None
    history: list[dict[str, Any]] = field(default_factory=list)
    """What the client would resend: its turns and the answers it got."""
    sent: list[list[str]] = field(default_factory=list)
    """Fingerprints of the turns it sent as new, in order; a group sent at once may land in either order."""
    answers: list[str] = field(default_factory=list)
    """Answers returned with store on."""
    last: tuple[list[dict[str, Any]], dict[str, str]] | None = None
    """Its last stored request (messages, headers), for a retry."""
    found: str | None = None
    """The session the service keeps a conversation without a session id in."""


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


class ChatConversations(RuleBasedStateMachine):
    loop: asyncio.AbstractEventLoop
    client: Any
    upstream: ScriptedUpstream

    steps = 0
    calls = 0

    def __init__(self) -> None:
        super().__init__()
        self.clients = {kind: Client(kind, "u-" + uuid.uuid4().hex[:8], _session(kind)) for kind in KINDS}
        self.upstream.failures.clear()

    # -- the wire --

    def _call(self, messages, *, client: Client, headers=None, **more):
        return self.loop.run_until_complete(self._post(messages, client=client, headers=headers, **more))

    async def _post(self, messages, *, client: Client, headers=None, **more):
        ChatConversations.calls += 1
        sent = {"X-Session-Id": client.session} if client.session else {}
        body = {"model": "m", "messages": messages, "user": client.user, **more}
        return await self.client.post(URL, json=body, headers=sent | (headers or {}))

    def _request(self, client: Client, newest: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if client.kind == "newest":
            return newest
        if client.kind == "dropper" and len(client.history) > 4:
            return [*client.history[-4:], *newest]
        return [*client.history, *newest]

    def _answered(self, response, client: Client, request: list[dict[str, Any]]) -> str:
        assert response.status_code == 200, response.text
        body = response.json()
        answer = body["choices"][0]["message"]["content"]
        prompt = next(r for r in reversed(self.upstream.requests) if r["messages"][-1] == _wire(request[-1]))
        assert prompt["messages"][-1] == _wire(request[-1])  # the prompt ends with the request's newest turn
        if client.kind == "sessionless" and body["memory"]["stored_seqs"]:
            seen = body["memory"]["session_id"]
            assert not client.history or seen == client.found, "a conversation without a session id moved"
            client.found = seen
        return answer

    def _say(self, client: Client, newest: list[dict[str, Any]], headers=None) -> None:
        request = self._request(client, newest)
        response = self._call(request, client=client, headers=headers)
        answer = self._answered(response, client, request)
        client.sent.extend([[fingerprint(t)] for t in newest])
        client.answers.append(answer)
        client.history += [*newest, {"role": "assistant", "content": answer}]
        client.last = (request, headers or {})

    # -- the rules --

    @rule(kind=st.sampled_from(KINDS), text=WORDS)
    def a_new_turn(self, kind: str, text: str) -> None:
        self._say(self.clients[kind], [user(text)], {"x-stainless-retry-count": "0"})

    @rule(kind=st.sampled_from(KINDS), text=WORDS)
    def a_new_turn_from_a_plain_client(self, kind: str, text: str) -> None:
        self._say(self.clients[kind], [user(text)])

    @rule(kind=st.sampled_from(KINDS), stream=st.booleans())
    def a_retry_after_the_answer_was_stored(self, kind: str, stream: bool) -> None:
        client = self.clients[kind]
        if client.last is None or "x-stainless-retry-count" not in client.last[1]:
            return
        request, _ = client.last
        calls = len(self.upstream.requests)
        response = self._call(request, client=client, headers={"x-stainless-retry-count": "1"}, stream=stream)
        assert response.status_code == 200, response.text
        assert len(self.upstream.requests) == calls  # the model is not asked again
        if stream:
            assert client.answers[-1] in response.text and response.text.rstrip().endswith("data: [DONE]")
        else:
            assert response.json()["choices"][0]["message"]["content"] == client.answers[-1]

    @rule(kind=st.sampled_from(KINDS), text=WORDS)
    def a_retry_after_the_model_failed(self, kind: str, text: str) -> None:
        client = self.clients[kind]
        request = self._request(client, [user(text)])
        self.upstream.failures.append((500, "engine crashed", {}))
        failed = self._call(request, client=client, headers={"x-stainless-retry-count": "0"})
        assert failed.status_code == 502, failed.text
        if client.kind == "sessionless" and not client.history:
            return  # its first call: the retry would open the session the failed one opened, as a client sees it
        self._say(client, [user(text)], {"x-stainless-retry-count": "1"})

    @rule(kind=st.sampled_from(KINDS), text=WORDS)
    def a_question_not_stored(self, kind: str, text: str) -> None:
        client = self.clients[kind]
        if client.kind == "sessionless" and not client.history:
            return
        request = self._request(client, [user(text)])
        response = self._call(request, client=client, store=False)
        self._answered(response, client, request)
        assert response.json()["memory"]["stored_seqs"] == []

    @precondition(lambda self: len(self.clients["whole"].history) >= 2)
    @rule(edit=st.booleans(), text=WORDS)
    def an_edited_or_regenerated_last_turn(self, edit: bool, text: str) -> None:
        """The client sends its last request again (regenerate), or with its newest exchange edited;
        either is new: the exchange is stored again, the old one stays in the log."""
        client = self.clients["whole"]
        body = client.history[:-1]  # the last request: all but the answer it got
        answered = max((i for i, t in enumerate(body) if t["role"] == "assistant" and not t.get("tool_calls")), default=-1)
        client.history = body[: answered + 1]
        self._say(client, [user(text)] if edit else body[answered + 1 :])

    @rule(first=WORDS, second=WORDS)
    def two_calls_at_once_in_one_session(self, first: str, second: str) -> None:
        client = self.clients["newest"]

        async def both():
            return await asyncio.gather(*(self._post([user(t)], client=client) for t in (first, second)))

        responses = self.loop.run_until_complete(both())
        for response, text in zip(responses, (first, second), strict=True):
            client.answers.append(self._answered(response, client, [user(text)]))
        client.sent.append(sorted([fingerprint(user(first)), fingerprint(user(second))]))
        client.last = None

    @rule(kind=st.sampled_from(("whole", "newest")), text=WORDS)
    def a_tool_call_and_its_result(self, kind: str, text: str) -> None:
        client = self.clients[kind]
        ident = "call_" + uuid.uuid4().hex[:6]
        call = {"id": ident, "type": "function", "function": {"name": "lookup", "arguments": '{"q": "' + text.strip() + '"}'}}
        turns = [user(text), {"role": "assistant", "content": "", "tool_calls": [call]}]
        turns.append({"role": "tool", "tool_call_id": ident, "content": '{"found": 1}'})
        self._say(client, turns)

    # -- the invariants --

    @invariant()
    def every_log_holds_what_its_client_said_and_the_answers_it_got(self) -> None:
        ChatConversations.steps += 1
        for client in self.clients.values():
            session = client.session or client.found
            if session is None:
                continue
            page = self.loop.run_until_complete(self.client.get(f"/v1/sessions/{session}/messages", params={"limit": 1000}))
            assert page.status_code in (200, 404), page.text
            log = page.json()["messages"] if page.status_code == 200 else []
            answers = [m["content"] for m in log if m["role"] == "assistant" and m["content"].startswith("answer-")]
            said = [fingerprint(_turn(m)) for m in log if not (m["role"] == "assistant" and m["content"].startswith("answer-"))]
            assert sorted(answers) == sorted(client.answers) and len(set(answers)) == len(answers), (answers, client.answers)
            expected, at = [], 0
            for group in client.sent:
                landed = said[at : at + len(group)]
                expected += landed if sorted(landed) == sorted(group) else group
                at += len(group)
            assert said == expected, (client.kind, len(said), len(expected))


def _session(kind: str) -> str | None:
    return None if kind == "sessionless" else "s-" + uuid.uuid4().hex[:10]


def _wire(turn: dict[str, Any]) -> dict[str, Any]:
    """A turn as the service sends it to the model."""
    return {k: v for k, v in turn.items() if v is not None}


def _turn(stored: dict[str, Any]) -> dict[str, Any]:
    return {k: stored[k] for k in ("role", "content", "name", "tool_call_id", "tool_calls") if stored.get(k) is not None}


def test_every_sequence_of_chat_calls_keeps_each_turn_once_and_each_answer(backends, embed, upstream):
    loop = asyncio.new_event_loop()
    app = chat_app(backends, embed, upstream)
    client, _ = loop.run_until_complete(app.__aenter__())
    ChatConversations.loop, ChatConversations.client, ChatConversations.upstream = loop, client, upstream
    try:
        run_state_machine_as_test(
            ChatConversations,
            settings=settings(
                max_examples=EXAMPLES,
                stateful_step_count=STEPS,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            ),
        )
        machine = ChatConversations
        print(f"\nchat property: {EXAMPLES} conversations, {machine.steps} checked steps, {machine.calls} calls")
    finally:
        loop.run_until_complete(app.__aexit__(None, None, None))
        loop.close()
