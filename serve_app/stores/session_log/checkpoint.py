"""A session's summary checkpoint, written by compare-and-set on its version."""

from __future__ import annotations

import json
from functools import cached_property
from typing import Any

from redis.commands.core import AsyncScript

from serve_app.stores.session_log.connection import SessionLogConnection

_CHECKPOINT_CAS = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -2 end
local version = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if version ~= tonumber(ARGV[1]) then return -1 end
local covers = tonumber(redis.call('HGET', KEYS[1], 'covers_upto_seq') or '0')
if tonumber(ARGV[3]) < covers or tonumber(ARGV[3]) > redis.call('LLEN', KEYS[2]) then return -1 end
redis.call('HSET', KEYS[1], 'summary', ARGV[2], 'covers_upto_seq', ARGV[3], 'summary_degraded', ARGV[4],
           'summary_state', ARGV[5], 'version', version + 1)
return version + 1
"""


class Checkpoints(SessionLogConnection):
    """The summary, the seq it covers and its version, kept in the session's meta."""

    @cached_property
    def _cas(self) -> AsyncScript:
        return self.redis.register_script(_CHECKPOINT_CAS)

    async def write_checkpoint(
        self,
        tenant: str,
        session: str,
        *,
        expected_version: int,
        summary: str,
        covers_upto_seq: int,
        degraded: bool,
        state: dict[str, Any] | None,
    ) -> int | None:
        """Compare-and-set the summary checkpoint; None when another writer got there first.
        Confirmed by replicas: a lost checkpoint hands its version number out again, so a compactor
        that read the lost one could win a compare-and-set against a summary it never saw."""
        meta_key, log_key, _ = self._keys(tenant, session)
        args = [expected_version, summary, covers_upto_seq, "1" if degraded else "0", json.dumps(state or {})]
        out = int(await self.writes.script(self._cas, [meta_key, log_key], args))
        return out if out >= 0 else None
