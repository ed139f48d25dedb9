"""Which turns of an OpenAI chat request are new to the session log: each rule, pure."""

from __future__ import annotations

from serve_app.core.chat_history import Alignment, derived_session_id, fingerprint, plan_append


def u(text: str) -> dict:
    return {"role": "user", "content": text}


def a(text: str) -> dict:
    return {"role": "assistant", "content": text}


LOG = [u("Plan a trip to Oslo."), a("Sure."), u("In May."), a("Three days?")]


def plan(log, request, seen_before=False):
    return plan_append([fingerprint(m) for m in log], request, session="s1", log_length=len(log), seen_before=seen_before)


def test_a_new_session_stores_every_turn():
    p = plan([], LOG)
    assert p.alignment is Alignment.NEW and p.new == LOG and len(set(p.ids)) == 4


def test_the_whole_history_resent_stores_only_the_new_turn():
    p = plan(LOG, [*LOG, u("Yes.")])
    assert p.alignment is Alignment.CONTINUES and p.new == [u("Yes.")]


def test_a_client_that_dropped_its_oldest_turns_still_continues():
    p = plan(LOG, [*LOG[2:], u("Yes.")])
    assert p.alignment is Alignment.CONTINUES and p.new == [u("Yes.")]


def test_a_retry_of_an_earlier_request_stores_nothing():
    assert plan(LOG, LOG[:3]).alignment is Alignment.REPLAYED and plan(LOG, LOG[:3]).new == []


def test_an_edited_turn_diverges_and_only_the_newest_exchange_is_stored():
    p = plan(LOG, [LOG[0], LOG[1], u("In June instead.")])
    assert p.alignment is Alignment.DIVERGED and p.new == [u("In June instead.")]


def test_an_expired_session_resent_stores_only_the_newest_exchange():
    p = plan([], [*LOG, u("And hotels?")], seen_before=True)
    assert p.alignment is Alignment.EXPIRED and p.new == [u("And hotels?")]


def test_the_same_words_again_are_a_new_turn_with_another_id():
    first = plan(LOG, [*LOG, u("ok")])
    again = plan([*LOG, u("ok"), a("Fine.")], [*LOG, u("ok"), a("Fine."), u("ok")])
    assert first.new == again.new == [u("ok")] and first.ids != again.ids


def test_racing_copies_of_a_request_get_the_same_ids():
    assert plan(LOG, [*LOG, u("Yes.")]).ids == plan(LOG, [*LOG, u("Yes.")]).ids


def test_a_diverged_tool_result_is_stored_with_the_call_it_answers():
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}]}
    result = {"role": "tool", "tool_call_id": "c1", "content": "42"}
    p = plan(LOG, [u("Something else."), call, result])
    assert p.alignment is Alignment.DIVERGED and p.new == [call, result]


def test_fingerprints_ignore_whitespace_and_argument_formatting_but_not_words():
    call = lambda args: {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": args}}]}  # noqa: E731
    assert fingerprint(u("a  b\n")) == fingerprint(u("a b"))
    assert fingerprint(call('{"x": 1, "y": 2}')) == fingerprint(call('{"y":2,"x":1}'))
    assert fingerprint(u("a b")) != fingerprint(a("a b")) != fingerprint(u("a c"))


def test_a_derived_session_is_the_same_on_every_call_of_a_conversation():
    one = derived_session_id("t", "alice", "Be terse.", u("Plan a trip to Oslo."))
    assert one == derived_session_id("t", "alice", "Be  terse.", u("Plan a trip to Oslo."))
    assert one != derived_session_id("t", "bob", "Be terse.", u("Plan a trip to Oslo."))
    assert one.startswith("chat-")
