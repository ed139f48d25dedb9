"""Which turns of an OpenAI chat request are new to the session log: each rule, pure. (The generated
test of every sequence of calls is tests/contract/test_chat_property.py.)"""

from __future__ import annotations

from serve_app.core.chat_history import Alignment, fingerprint, history_digest, overlap, plan_append, turn_id


def u(text: str) -> dict:
    return {"role": "user", "content": text}


def a(text: str) -> dict:
    return {"role": "assistant", "content": text}


LOG = [u("Plan a trip to Oslo."), a("Sure."), u("In May."), a("Three days?")]


def plan(log, request, seen_before=False):
    return plan_append([fingerprint(m) for m in log], request, seen_before=seen_before)


def test_a_new_session_stores_every_turn():
    p = plan([], LOG)
    assert p.alignment is Alignment.NEW and p.new == LOG


def test_the_whole_history_resent_stores_only_the_new_turn():
    p = plan(LOG, [*LOG, u("Yes.")])
    assert p.alignment is Alignment.CONTINUES and p.new == [u("Yes.")]


def test_a_client_that_dropped_its_oldest_turns_still_continues():
    p = plan(LOG, [*LOG[2:], u("Yes.")])
    assert p.alignment is Alignment.CONTINUES and p.new == [u("Yes.")]


def test_the_newest_turn_alone_is_new_even_when_it_repeats_the_log():
    for request in ([u("In May.")], [a("Three days?")], [LOG[-1]]):
        p = plan(LOG, request)
        assert p.alignment is Alignment.LATEST and p.new == request


def test_an_earlier_request_sent_again_is_not_a_replay_its_newest_turn_is_new():
    p = plan(LOG, LOG[:3])  # aligned by position against the tail, never found further back
    assert p.alignment is Alignment.DIVERGED and p.new == [u("In May.")]


def test_an_edited_turn_diverges_and_only_the_newest_exchange_is_stored():
    p = plan(LOG, [LOG[0], LOG[1], u("In June instead.")])
    assert p.alignment is Alignment.DIVERGED and p.new == [u("In June instead.")]


def test_an_expired_session_resent_stores_only_the_newest_exchange():
    p = plan([], [*LOG, u("And hotels?")], seen_before=True)
    assert p.alignment is Alignment.EXPIRED and p.new == [u("And hotels?")]


def test_the_overlap_leaves_at_least_the_newest_turn_new():
    prints = [fingerprint(m) for m in LOG]
    assert overlap(prints, prints) == 0  # the request equals the log: its newest turn is still new
    assert overlap(prints, [*prints, fingerprint(u("x"))]) == 4
    assert overlap(prints, [fingerprint(u("x"))]) == 0


def test_turn_ids_are_the_calls_own():
    assert turn_id("call-1", 0) == turn_id("call-1", 0)
    assert len({turn_id("call-1", 0), turn_id("call-2", 0), turn_id("call-1", 1), turn_id("call-1", "answer")}) == 4


def test_a_diverged_tool_result_is_stored_with_the_call_it_answers():
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}]}
    result = {"role": "tool", "tool_call_id": "c1", "content": "42"}
    p = plan(LOG, [u("Something else."), a("Hm."), u("Look it up."), call, result])
    assert p.alignment is Alignment.DIVERGED and p.new == [u("Look it up."), call, result]
    alone = plan(LOG, [u("Look it up."), call, result])  # no answer before it: all of it is new
    assert alone.alignment is Alignment.LATEST and alone.new == [u("Look it up."), call, result]


def test_fingerprints_ignore_whitespace_and_argument_formatting_but_not_words():
    call = lambda args: {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": args}}]}  # noqa: E731
    assert fingerprint(u("a  b\n")) == fingerprint(u("a b"))
    assert fingerprint(call('{"x": 1, "y": 2}')) == fingerprint(call('{"y":2,"x":1}'))
    assert fingerprint(u("a b")) != fingerprint(a("a b")) != fingerprint(u("a c"))
    assert fingerprint({"role": "assistant", "tool_calls": [{"id": "c", "function": "not an object"}]})  # no crash


def test_a_history_digest_names_the_whole_history_and_who_speaks():
    one = history_digest("t", "alice", "Be terse.", LOG[:2])
    assert one == history_digest("t", "alice", "Be  terse.", LOG[:2])
    assert one != history_digest("t", "bob", "Be terse.", LOG[:2]) != history_digest("t", "alice", "Be terse.", LOG[:1])
