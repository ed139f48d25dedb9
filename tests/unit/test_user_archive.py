"""Reading a user archive back: a whole one reads, anything cut off or out of order is refused with
the line that is wrong, so an import never writes half of what it was given."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from serve_app.core.user_archive import (
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

WHEN = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)


def _archive() -> list[str]:
    lines = [
        Header(user_id="alice", exported_at=WHEN, embedding=Embedding(model="all-MiniLM-L6-v2", document_embedding=2, int8=True)),
        SessionLine(session_id="s1", messages=2, summary="", covers_upto_seq=0),
        MessageLine(session_id="s1", seq=1, message={"role": "user", "content": "hi", "created_at": WHEN.isoformat()}),
        MessageLine(session_id="s1", seq=2, message={"role": "assistant", "content": "hello", "created_at": WHEN.isoformat()}),
        MemoryLine(id="m1", kind="memory", role="memory", text="likes tea", created_at=WHEN),
        FactLine(key="city", value="Oslo", category="profile", valid_from=WHEN),
        End(counts={"sessions": 1, "messages": 2, "memories": 1, "facts": 1}),
    ]
    return [dump_line(line) for line in lines]


def test_a_whole_archive_reads_back_as_it_was_written():
    archive = read_archive(_archive())
    assert archive.header.user_id == "alice" and archive.counts() == {"sessions": 1, "messages": 2, "memories": 1, "facts": 1}
    assert [m.message["content"] for m in archive.messages["s1"]] == ["hi", "hello"]
    assert archive.facts[0].valid_from == WHEN


@given(st.data())
def test_an_archive_cut_anywhere_is_refused(data):
    lines = _archive()
    cut = data.draw(st.integers(0, len(lines) - 1))
    with pytest.raises(ArchiveError):
        read_archive(lines[:cut])


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda ls: [ls[0], ls[1], ls[3], ls[2], *ls[4:]], "line 3: seq 2 where 1 comes next"),
        (lambda ls: [ls[0], ls[2], ls[1], *ls[3:]], "line 2: a message of session s1 outside"),
        (lambda ls: [ls[1], *ls], "line 1: an archive starts with its 'archive' line"),
        (lambda ls: [*ls[:4], "{not json\n", *ls[4:]], "line 5: not JSON"),
        (lambda ls: [*ls[:4], ls[4].replace('"memory","role"', '"memory","role","colour":"red"'), *ls[5:]], "line 5"),
        (lambda ls: [*ls[:-1], ls[-1].replace('"facts":1', '"facts":2')], "the end line counts"),
        (lambda ls: [*ls, ls[4]], "nothing may follow the end line"),
        (lambda ls: [ls[0].replace('"version":1', '"version":9'), *ls[1:]], "archive version 9 is newer"),
    ],
)
def test_what_is_wrong_is_named_with_its_line(change, says):
    with pytest.raises(ArchiveError, match=says.replace("(", r"\(")):
        read_archive(change(_archive()))
