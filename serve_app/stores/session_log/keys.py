"""The session log's key layout, and the one guarantee it exists for: every key of one session lies
in one Redis Cluster slot.

Every multi-key change to a session is one Lua script, and a script may only touch keys of one
slot. So each session belongs to a lane shard (`lane_shard`, a hash of `tenant/session`), and every
key its scripts touch carries that shard's hash tag (`hash_tag`: the part in braces, which alone
decides the slot): the session's meta, log, client ids and leases (`SessionKeys._base`), its entry
in the embedding lane and in the LLM lane (one pair of lanes per shard, `lane_keys`), and its entry
in its user's session index (one part per shard, `SessionKeys.user_index_key`). The append that
stores a turn thus also enters the session in the embedding lane and in its user's index
atomically, on a cluster as on a single Redis. The memorizer sweeps the lanes shard by shard;
listing a user's sessions reads the user's parts. `tests/contract/test_session_log.py` checks the
slots on a real cluster.

Keys of no session (a user's tombstone, a tenant's counters) are only ever written by single
commands, so each may lie in a slot of its own.
"""

from __future__ import annotations

import zlib

LANE_SHARDS = 64
"""Shards of each lane. Part of the key layout: a session's keys carry its shard's hash tag, so
changing it moves every session (a migration, like `migrate_layout`). 64 slots spread sessions
within one shard of even over up to about twenty cluster masters, and keep a sweep (every
`memorizer_sweep_interval_s`) at a few hundred small commands, one round trip per node."""


def session_member(tenant: str, session: str) -> str:
    """A session as the lanes and the user index name it: `tenant/session`."""
    return f"{tenant}/{session}"


def split_member(raw: str) -> tuple[str, str]:
    tenant, session = raw.split("/", 1)
    return tenant, session


def lane_shard(member: str) -> int:
    """The lane shard of a session (`tenant/session`): stable across processes and versions."""
    return zlib.crc32(member.encode()) % LANE_SHARDS


def hash_tag(shard: int) -> str:
    """The hash tag every key of one lane shard carries: its keys share one slot."""
    return f"{{l{shard}}}"


def lane_keys(shard: int) -> tuple[str, str]:
    """The embedding lane and the LLM lane of one shard.
    The embedding lane: sessions with turns not yet memorized, scored by the oldest one's arrival.
    The LLM lane: sessions owed extraction, an LLM summary or its redo, scored by when they are due;
    apart from the embedding lane, so that an LLM outage never holds up embedding."""
    return f"ms:{hash_tag(shard)}:pending", f"ms:{hash_tag(shard)}:pending:llm"


class SessionKeys:
    """The keys of one session, as the parts of `SessionLog` name them: every one of them carries the
    hash tag of the session's lane shard, so all lie in one slot. A user's tombstone and a tenant's
    counters are the keys of no session."""

    @staticmethod
    def pending_member(tenant: str, session: str) -> str:
        return session_member(tenant, session)

    @staticmethod
    def _base(tenant: str, session: str) -> str:
        member = session_member(tenant, session)
        return f"ms:{hash_tag(lane_shard(member))}:s:{member}"

    def _keys(self, tenant: str, session: str) -> tuple[str, str, str]:
        base = self._base(tenant, session)
        return f"{base}:meta", f"{base}:log", f"{base}:ids"

    def _lease_key(self, tenant: str, session: str, lane: str) -> str:
        return f"{self._base(tenant, session)}:lease:{lane}"

    def _lanes(self, tenant: str, session: str) -> tuple[str, str]:
        return lane_keys(lane_shard(self.pending_member(tenant, session)))

    @staticmethod
    def user_index_key(tenant: str, user: str, shard: int) -> str:
        """One part of the user's session index: the sessions of one lane shard, in its slot."""
        return f"ms:{hash_tag(shard)}:u:{tenant}/{user}:sessions"

    def _user_index(self, tenant: str, user: str, session: str) -> str:
        return self.user_index_key(tenant, user, lane_shard(self.pending_member(tenant, session)))

    @staticmethod
    def tombstone_key(tenant: str, user: str) -> str:
        return f"ms:{{{tenant}/u/{user}}}:forgotten"

    @staticmethod
    def stats_key(tenant: str) -> str:
        return f"ms:{{{tenant}}}:stats"
