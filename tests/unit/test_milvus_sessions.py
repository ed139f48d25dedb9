"""Which etcd sessions of the embedded Milvus server a start may delete (pure selection)."""

from hypothesis import given
from hypothesis import strategies as st

from serve_app.embedded.milvus_server import Session, stale_sessions


def _sessions(server_ids: list[int]) -> list[Session]:
    return [Session(key=f"k{i}", revision=str(i), server_id=server_id) for i, server_id in enumerate(server_ids)]


def test_a_restarted_process_drops_its_predecessors_sessions_and_keeps_its_own():
    sessions = _sessions([1, 1, 2, 1, 2])  # nodes of process 1 left behind; process 2 registering
    assert [s.key for s in stale_sessions(sessions)] == ["k0", "k1", "k3"]


def test_before_the_new_process_registers_nothing_is_stale():
    assert stale_sessions(_sessions([3, 3, 3])) == [] and stale_sessions([]) == []


@given(st.lists(st.integers(min_value=1, max_value=6), max_size=12))
def test_only_sessions_below_the_newest_server_id_are_stale(server_ids):
    sessions = _sessions(server_ids)
    stale = stale_sessions(sessions)
    newest = max(server_ids, default=0)
    assert all(s.server_id < newest for s in stale)
    assert [s for s in sessions if s not in stale] == [s for s in sessions if s.server_id == newest]
